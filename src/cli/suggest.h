// "Did you mean ...?": the nearest name by edit distance, for misspelled commands, options,
// config keys and sections.
#pragma once
#include <string>
#include <vector>

namespace lt::cli {

// Levenshtein distance (insertions, deletions, substitutions of single bytes).
int edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `word`, or "" when even the nearest needs more edits than half the
// word's length (at least 2): then it is a different word, not a typo. A word that begins a
// candidate (at least 3 characters) is taken as that candidate cut short.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// "; did you mean 'X'?" for nearest_name, or "" when there is none.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace lt::cli
