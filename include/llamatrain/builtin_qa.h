// The embedded default question/context/answer dataset: short fact contexts ("Tom keeps the red
// ball in the kitchen. ...") with a yes/no/maybe question about one item, generated from a fixed
// grammar and a seed so fine-tuning needs no downloaded data. Contexts hold 2-3 facts with
// distinct people, colours, objects and places. The answer always follows from the context:
// "yes" when the context puts the asked item in the asked place, "no" when it puts it elsewhere
// (the asked place being, half the time each, another item's place or one never mentioned),
// "maybe" when the item is not mentioned. The vocabulary is small (under 100 distinct
// words) so that a 512-1024-piece tokenizer and a ~1M-parameter model can learn it on a CPU.
// Meant for `prepare --qa builtin:factqa`, as `--text builtin:tinytales` is for builtin_corpus
// (that wiring belongs to the prepare command, not to this file).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace lt {

constexpr const char* kBuiltinQaName = "builtin:factqa";
constexpr int kBuiltinQaRecords = 4000;

// n_examples JSON lines (each ending in '\n'; empty for n_examples <= 0), in the reference
// fine-tuning format read by read_qa_file:
//   {"id":"factqa-<n>","question":…,"context":…,"answer":…,"final_decision":"yes"|"no"|"maybe"}
// with n = 1, 2, … in line order. Labels follow a fixed quota of 9 yes, 7 no and 4 maybe in each
// consecutive block of 20 records (45/35/20 %), in a seeded random order within the block.
// As in PubMedQA (LONG_ANSWER and final_decision), the answer is the evidence and the label is
// apart from it: for yes/no the context's sentence about the asked item, copied verbatim, then the
// asked place restated ("Tom keeps the red ball in the garden. The question asks about the
// kitchen."); for maybe "The context does not say where the <item> is." Trained with `prepare
// --answer-field both`, the model writes the evidence, then the decision ("\nFinal decision: no"),
// so that the decision follows the sentence it rests on and compares two places a fixed number of
// tokens before it (docs/benchmarks.md, "The quick start": deciding first, a 4-layer model reached
// 0.61 and 0.83 in 20 epochs; without the restated place, seeds that never formed the comparison). No two records share the same (question, context) pair. The same
// (n_examples, seed) gives the same bytes on every platform (lt::Rng only).
std::string builtin_qa_jsonl(int n_examples = kBuiltinQaRecords, uint64_t seed = 1);

// The JSON lines of the generated set a source names: "builtin:factqa" (kBuiltinQaRecords records)
// or "builtin:factqa:N" (N records, 20 <= N <= 1000000; records are generated in sequence, so its
// first 4000 are builtin:factqa's). Any other source: std::nullopt. A malformed or out-of-range
// count throws lt::Error naming the source and what was expected.
std::optional<std::string> builtin_qa_source(const std::string& source);

}  // namespace lt
