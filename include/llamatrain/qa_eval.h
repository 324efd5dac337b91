// Multiple-choice evaluation of yes/no/maybe questions (PubMedQA): each candidate answer is
// scored by the log-likelihood of its tokens as the continuation of the formatted prompt, the
// way evaluation harnesses score multiple choice; the highest wins.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llamatrain/model.h"
#include "llamatrain/qa.h"
#include "llamatrain/tokenizer.h"

namespace lt {

struct QaEvalResult {
  int64_t examples = 0;        // scored (with a yes/no/maybe label)
  int64_t skipped = 0;         // no label, or too long even without context
  int64_t truncated = 0;       // context shortened to fit max_seq_len
  double accuracy = 0;
  double macro_f1 = 0;         // mean over yes/no/maybe of 2PR/(P+R) (0 where undefined)
  std::array<std::array<int64_t, 3>, 3> confusion{};  // [true label][predicted]
  std::string to_json() const;
};

// Candidates are the label words "yes", "no", "maybe" as the first words of the answer.
QaEvalResult evaluate_yes_no_maybe(Llama2Model& model, const Tokenizer& tok,
                                   const std::vector<QaRecord>& records, int prompt_type,
                                   const std::function<void(int64_t records_done)>& on_record = {});

}  // namespace lt
