// Multiple-choice evaluation of yes/no/maybe questions (PubMedQA): each candidate answer is
// scored by the log-likelihood of its tokens as the continuation of the formatted prompt, the
// way evaluation harnesses score multiple choice; the highest wins.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llamatrain/engine.h"
#include "llamatrain/inference.h"
#include "llamatrain/model.h"
#include "llamatrain/qa.h"
#include "llamatrain/tokenizer.h"

namespace lt {

struct QaEvalResult {
  int64_t examples = 0;        // scored (with a yes/no/maybe label)
  int64_t skipped = 0;         // no label, or too long even without context
  int64_t too_long = 0;        // of skipped: too long for max_seq_len even without context
  int64_t truncated = 0;       // context shortened to fit max_seq_len
  double accuracy = 0;
  double macro_f1 = 0;         // mean over yes/no/maybe of 2PR/(P+R) (0 where undefined)
  std::array<std::array<int64_t, 3>, 3> confusion{};  // [true label][predicted]
  // --answer-field both: the long answers generated before the decision was scored.
  bool generated = false;
  int64_t generated_tokens = 0;   // all records together
  int64_t lead_found = 0;         // records whose generation reached "\nFinal decision:"
  std::string to_json() const;
};

struct QaEvalOptions {
  PromptFormat format;                                   // as the model was trained
  AnswerField answer_field = AnswerField::kLongAnswer;   // where the decision is
  int max_new_tokens = 256;  // --answer-field both: cap of the generated long answer (and at most
                             // a quarter of the model's max_seq_len, the prompt's context cut to leave it)
};

// Where the format puts the decision: for long_answer and final_decision the candidates "yes",
// "no", "maybe" are the first words after the prompt. For both, the model first writes the long
// answer greedily after the prompt until it emits "\nFinal decision:" (kFinalDecisionLead without
// its space), EOS, the format's suffix, or the cap (generate_long_answer below); the candidates are
// then scored as the continuation of prompt + that text + kFinalDecisionLead, in
// the context generation kept.
// The candidates are scored by `scorer`'s forward and the long answer of `both` is written by
// `writer` (any device each; null writer: a CPU decoder of `model`, made when needed); model's config
// gives the context length, of which writer must cache all.
QaEvalResult evaluate_yes_no_maybe(Evaluator& scorer, const Llama2Model& model, const Tokenizer& tok,
                                   const std::vector<QaRecord>& records,
                                   const QaEvalOptions& opt,
                                   const std::function<void(int64_t records_done)>& on_record = {},
                                   Decoder* writer = nullptr);

// --answer-field both, one record: the long answer the model writes greedily after
// generation_prompt_tokens of the record (its reference answer decides the prompt's last piece as
// training tokenized it), up to "\nFinal decision:", EOS, the format's
// suffix or long_answer_room tokens. The context is cut so that prompt, room and
// decision_reserve_tokens fit max_seq_len; the decision is then scored in that same context with
// lead = text + kFinalDecisionLead (prepare.h tokenize_example). False when the prompt does not fit
// even without its context.
struct GeneratedAnswer {
  std::string text;        // what follows the prompt (a trailing space the prompt's tokens left out
                           // and the model wrote is the prompt's, not text's)
  std::string context;     // the context it was written in (the record's, or what was kept)
  bool truncated = false;  // the context was cut
  int64_t tokens = 0;      // generated
  bool lead_found = false; // stopped at "\nFinal decision:"
};
// writer: a decoder of the model (config cfg) caching cfg.max_seq_len positions.
bool generate_long_answer(Decoder& writer, const Llama2Config& cfg, const Tokenizer& tok, const QaRecord& rec,
                          const QaEvalOptions& opt, GeneratedAnswer* out);
// BOS and the tokens of rec's prompt as training has them before its answer: the pieces that end
// within the prompt's bytes in the tokenization of prompt + rec.answer, without a piece that
// straddles into the answer (so a trailing space that training joins to the answer's first piece,
// "▁Yes", is left for the model to write, while a tokenizer that keeps "▁" alone keeps it). With
// an empty answer: the tokens of generation_prompt (qa.h).
std::vector<int32_t> generation_prompt_tokens(const Tokenizer& tok, const QaRecord& rec, const PromptFormat& format);
// Tokens at most of the generated long answer: max_new_tokens, at most max_seq_len / 4, at least 1.
int long_answer_room(const QaEvalOptions& opt, int max_seq_len);
// Tokens kept free after the long answer for kFinalDecisionLead and the longest candidate.
int decision_reserve_tokens(const Tokenizer& tok);

}  // namespace lt
