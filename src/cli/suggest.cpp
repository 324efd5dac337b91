#include "cli/suggest.h"

#include <algorithm>

namespace lt::cli {

int edit_distance(const std::string& a, const std::string& b) {
  // One row of the dynamic programme: row[j] = distance(a[0..i), b[0..j)).
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = int(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = int(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_d = std::max(2, int(word.size()) / 2) + 1;
  for (const auto& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_d) best = c, best_d = d;
  }
  if (!best.empty() || word.size() < 3) return best;
  // A cut-short name (--warmup for --warmup-steps): the shortest candidate it begins.
  for (const auto& c : candidates)
    if (c.rfind(word, 0) == 0 && (best.empty() || c.size() < best.size())) best = c;
  return best;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string n = nearest_name(word, candidates);
  return n.empty() ? std::string() : "; did you mean '" + n + "'?";
}

}  // namespace lt::cli
