#include "llamatrain/qa_eval.h"

#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/prepare.h"

namespace lt {

namespace {
const char* const kCandidates[3] = {"yes", "no", "maybe"};
}

std::string QaEvalResult::to_json() const {
  nlohmann::json j = {{"examples", examples}, {"skipped", skipped}, {"truncated_context", truncated},
                      {"accuracy", accuracy}, {"macro_f1", macro_f1}};
  for (int t = 0; t < 3; ++t)
    for (int p = 0; p < 3; ++p) j["confusion"][kCandidates[t]][kCandidates[p]] = confusion[size_t(t)][size_t(p)];
  return j.dump();
}

QaEvalResult evaluate_yes_no_maybe(Llama2Model& model, const Tokenizer& tok,
                                   const std::vector<QaRecord>& records, int prompt_type,
                                   const std::function<void(int64_t records_done)>& on_record) {
  QaEvalResult r;
  const int max_tokens = model.config().max_seq_len + 1;  // inputs are all tokens but the last
  std::vector<int32_t> inputs, targets;
  std::vector<uint8_t> mask;
  std::vector<float> losses;
  for (size_t i = 0; i < records.size(); ++i) {
    if (on_record) on_record(int64_t(i));
    const QaRecord& rec = records[i];
    const int8_t truth = label_code(rec.label);
    if (truth < 0) {
      ++r.skipped;
      continue;
    }
    // One row per candidate: prompt + candidate, loss mask on the candidate's tokens.
    QaExample ex[3];
    bool ok = true, truncated = false;
    for (int c = 0; c < 3 && ok; ++c) {
      QaRecord cand = rec;
      cand.answer = kCandidates[c];
      ok = tokenize_example(tok, cand, prompt_type, max_tokens, &ex[c], false);
      truncated |= ex[c].truncated;
    }
    if (!ok) {
      ++r.skipped;
      continue;
    }
    r.truncated += truncated;
    int T = 0;
    for (const auto& e : ex) T = std::max(T, int(e.tokens.size()) - 1);
    inputs.assign(size_t(3 * T), 0);
    targets.assign(size_t(3 * T), 0);
    mask.assign(size_t(3 * T), 0);
    for (int c = 0; c < 3; ++c) {
      const auto& tk = ex[c].tokens;
      for (int t = 0; t + 1 < int(tk.size()); ++t) {
        inputs[size_t(c * T + t)] = tk[size_t(t)];
        targets[size_t(c * T + t)] = tk[size_t(t + 1)];
        mask[size_t(c * T + t)] = t + 1 >= ex[c].answer_offset ? 1 : 0;
      }
    }
    Batch b;
    b.B = 3;
    b.T = T;
    b.inputs = inputs.data();
    b.targets = targets.data();
    b.loss_mask = mask.data();
    losses.resize(size_t(3 * T));
    model.forward(b, losses.data());
    int best = 0;
    double best_ll = -1e300;
    for (int c = 0; c < 3; ++c) {
      double ll = 0;
      for (int t = 0; t < T; ++t) ll -= mask[size_t(c * T + t)] ? double(losses[size_t(c * T + t)]) : 0.0;
      if (ll > best_ll) {  // ties go to the earlier candidate
        best_ll = ll;
        best = c;
      }
    }
    r.confusion[size_t(truth)][size_t(best)]++;
    ++r.examples;
  }
  if (r.examples == 0) return r;
  int64_t correct = 0;
  double f1_sum = 0;
  for (int k = 0; k < 3; ++k) {
    correct += r.confusion[size_t(k)][size_t(k)];
    int64_t predicted = 0, actual = 0;
    for (int j = 0; j < 3; ++j) {
      predicted += r.confusion[size_t(j)][size_t(k)];
      actual += r.confusion[size_t(k)][size_t(j)];
    }
    const double tp = double(r.confusion[size_t(k)][size_t(k)]);
    const double precision = predicted ? tp / double(predicted) : 0, recall = actual ? tp / double(actual) : 0;
    f1_sum += precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
  }
  r.accuracy = double(correct) / double(r.examples);
  r.macro_f1 = f1_sum / 3;
  return r;
}

}  // namespace lt
