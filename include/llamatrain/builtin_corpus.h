// The embedded default corpus: small stories generated from a fixed grammar and a seed, so the
// quick-start job and the tests need no downloaded data. `prepare --text builtin:tinytales`
// uses it.
#pragma once
#include <cstdint>
#include <string>

namespace lt {

constexpr const char* kBuiltinCorpusName = "builtin:tinytales";

// n_stories stories separated by blank lines; the same (n_stories, seed) gives the same bytes.
std::string builtin_corpus(int n_stories = 3000, uint64_t seed = 1);

}  // namespace lt
