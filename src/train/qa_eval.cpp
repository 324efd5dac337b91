#include "llamatrain/qa_eval.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/inference.h"
#include "llamatrain/prepare.h"

namespace lt {

namespace {

const char* const kCandidates[3] = {"yes", "no", "maybe"};

// The candidate whose tokens after prompt + lead have the highest log-likelihood (ties go to the
// earlier one), or -1 when the record does not fit max_seq_len even without its context. With a
// lead (--answer-field both) the record's context is the one generation kept, and a record that
// would need it cut further counts as too long (generation reserved room, so it does not happen).
int best_candidate(Evaluator& scorer, int max_seq_len, const Tokenizer& tok, const QaRecord& rec,
                   const PromptFormat& format, const std::string& lead, bool* truncated) {
  const int max_tokens = max_seq_len + 1;  // inputs are all tokens but the last
  // One row per candidate: prompt + candidate, loss mask on the candidate's tokens.
  QaExample ex[3];
  for (int c = 0; c < 3; ++c) {
    QaRecord cand = rec;
    cand.answer = kCandidates[c];
    if (!tokenize_example(tok, cand, format, max_tokens, &ex[c], false, lead)) return -1;
    if (!lead.empty() && ex[c].truncated) return -1;
    *truncated |= ex[c].truncated;
  }
  int T = 0;
  for (const auto& e : ex) T = std::max(T, int(e.tokens.size()) - 1);
  std::vector<int32_t> inputs(size_t(3 * T), 0), targets(size_t(3 * T), 0);
  std::vector<uint8_t> mask(size_t(3 * T), 0);
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
  std::vector<float> losses(size_t(3 * T));
  scorer.forward(b, losses.data());
  int best = 0;
  double best_ll = -1e300;
  for (int c = 0; c < 3; ++c) {
    double ll = 0;
    for (int t = 0; t < T; ++t) ll -= mask[size_t(c * T + t)] ? double(losses[size_t(c * T + t)]) : 0.0;
    if (ll > best_ll) {
      best_ll = ll;
      best = c;
    }
  }
  return best;
}

}  // namespace

int decision_reserve_tokens(const Tokenizer& tok) {
  int longest = 0;
  for (const char* c : kCandidates)
    longest = std::max(longest, int(tok.encode(std::string(kFinalDecisionLead) + c, false, false).size()));
  return longest + 4;  // slack: pieces merging differently at the joins, re-encoding the decoded text
}

std::vector<int32_t> generation_prompt_tokens(const Tokenizer& tok, const QaRecord& rec, const PromptFormat& format) {
  if (rec.answer.empty()) return tok.encode(generation_prompt(format.prompt(rec.question, rec.context)), true, false);
  QaExample ex;
  tokenize_example(tok, rec, format, std::numeric_limits<int>::max(), &ex, false);
  return std::vector<int32_t>(ex.tokens.begin(), ex.tokens.begin() + ex.answer_offset);
}

int long_answer_room(const QaEvalOptions& opt, int max_seq_len) {
  return std::max(1, std::min(opt.max_new_tokens, max_seq_len / 4));
}

bool generate_long_answer(Decoder& writer, const Llama2Config& cfg, const Tokenizer& tok, const QaRecord& rec,
                          const QaEvalOptions& opt, GeneratedAnswer* out) {
  const int max_len = cfg.max_seq_len;
  const int room = long_answer_room(opt, max_len);
  *out = GeneratedAnswer{};
  // The context cut so that the prompt, the answer's room and the decision after it all fit:
  // what fits here is then scored without another cut.
  QaRecord prompt_only = rec;
  prompt_only.answer.clear();
  QaExample p;
  if (!tokenize_example(tok, prompt_only, opt.format, max_len - room - decision_reserve_tokens(tok), &p, false))
    return false;
  out->context = p.context;
  out->truncated = p.truncated;
  QaRecord kept = rec;
  kept.context = p.context;
  const std::vector<int32_t> prompt = generation_prompt_tokens(tok, kept, opt.format);
  const std::string prompt_decoded = tok.decode(prompt);
  // The prompt's text that `prompt` leaves out (its trailing spaces, when training joins them to
  // the answer's first piece): the written text starts with them, and text is what follows the prompt.
  const std::string full_prompt = opt.format.prompt(rec.question, p.context);
  const std::string left_out = full_prompt.substr(std::min(full_prompt.size(), prompt_decoded.size()));
  const std::string lead = std::string(kFinalDecisionLead).substr(0, std::string(kFinalDecisionLead).size() - 1);
  const std::string suffix = opt.format.suffix();
  Sampler greedy(0.f, 1.f, 1);
  std::vector<int32_t> ids = prompt;
  const int n_prompt = int(prompt.size());
  for (int pos = 0; pos < max_len && out->tokens < room; ++pos) {
    const std::vector<float>& logits = writer.step(ids[size_t(pos)], pos);
    if (pos + 1 < n_prompt) continue;  // still reading the prompt
    const int32_t next = greedy.sample(logits);
    if (next == tok.eos_id() || next == tok.bos_id()) break;
    ids.push_back(next);
    ++out->tokens;
    // The text after the prompt, with the space its first piece may carry ("▁The" -> " The").
    const std::string full = tok.decode(ids);
    out->text = full.compare(0, prompt_decoded.size(), prompt_decoded) == 0 ? full.substr(prompt_decoded.size())
                                                                             : tok.decode(std::vector<int32_t>(ids.begin() + n_prompt, ids.end()));
    if (!left_out.empty() && out->text.compare(0, left_out.size(), left_out) == 0) out->text.erase(0, left_out.size());
    size_t stop = out->text.find(lead);
    const bool found = stop != std::string::npos;
    if (!suffix.empty()) stop = std::min(stop, out->text.find(suffix));
    if (stop != std::string::npos) {
      out->text.resize(stop);
      out->lead_found = found;
      break;
    }
  }
  return true;
}

namespace {

void fill_scores(QaEvalResult& r) {
  if (r.examples == 0) return;
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
}

}  // namespace

std::string QaEvalResult::to_json() const {
  nlohmann::json j = {{"examples", examples}, {"skipped", skipped}, {"too_long", too_long},
                      {"truncated_context", truncated},
                      {"accuracy", accuracy}, {"macro_f1", macro_f1}};
  for (int t = 0; t < 3; ++t)
    for (int p = 0; p < 3; ++p) j["confusion"][kCandidates[t]][kCandidates[p]] = confusion[size_t(t)][size_t(p)];
  if (generated) {
    j["generated_tokens"] = generated_tokens;
    j["final_decision_lead_found"] = lead_found;
  }
  return j.dump();
}

QaEvalResult evaluate_yes_no_maybe(Evaluator& scorer, const Llama2Model& model, const Tokenizer& tok,
                                   const std::vector<QaRecord>& records,
                                   const QaEvalOptions& opt,
                                   const std::function<void(int64_t records_done)>& on_record, Decoder* writer) {
  QaEvalResult r;
  r.generated = opt.answer_field == AnswerField::kBoth;
  std::unique_ptr<CpuDecoder> cpu_writer;
  if (r.generated && !writer) writer = (cpu_writer = std::make_unique<CpuDecoder>(model, model.config().max_seq_len)).get();
  for (size_t i = 0; i < records.size(); ++i) {
    if (on_record) on_record(int64_t(i));
    const QaRecord& rec = records[i];
    const int8_t truth = label_code(rec.label);
    bool truncated = false;
    std::string lead;
    QaRecord scored = rec;
    if (truth >= 0 && r.generated) {
      GeneratedAnswer g;
      if (!generate_long_answer(*writer, model.config(), tok, rec, opt, &g)) {
        ++r.skipped;
        ++r.too_long;
        continue;
      }
      r.generated_tokens += g.tokens;
      r.lead_found += g.lead_found;
      truncated = g.truncated;
      scored.context = g.context;  // scored in the context the long answer was written in
      lead = g.text + kFinalDecisionLead;
    }
    const int best = truth < 0 ? -1 : best_candidate(scorer, model.config().max_seq_len, tok, scored, opt.format, lead,
                                                          &truncated);
    if (best < 0) {
      ++r.skipped;
      r.too_long += truth >= 0;
      continue;
    }
    r.truncated += truncated;
    r.confusion[size_t(truth)][size_t(best)]++;
    ++r.examples;
  }
  fill_scores(r);
  return r;
}

}  // namespace lt
