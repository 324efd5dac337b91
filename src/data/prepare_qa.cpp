// `llamatrain prepare --qa`: records -> curated, prompt-formatted, tokenized examples with an
// answer-only loss mask -> rows packed without splitting an example -> HDF5 (dataset.h).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "llamatrain/builtin_qa.h"
#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/prepare.h"
#include "llamatrain/qa.h"
#include "llamatrain/tokenizer.h"

namespace lt {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string record_text(const QaRecord& r, const PromptFormat& format) {
  return format.prompt(r.question, r.context) + r.answer + format.suffix();
}

}  // namespace

int8_t label_code(const std::string& label) {
  if (label == "yes") return 0;
  if (label == "no") return 1;
  if (label == "maybe") return 2;
  return -1;
}

const char* label_name(int8_t code) {
  switch (code) {
    case 0: return "yes";
    case 1: return "no";
    case 2: return "maybe";
    default: return "";
  }
}

bool tokenize_example(const Tokenizer& tok, const QaRecord& rec, const PromptFormat& format, int max_tokens,
                      QaExample* out, bool complete, const std::string& lead) {
  const std::string suffix = complete ? format.suffix() : std::string();
  const int specials = complete ? 2 : 1;  // BOS and EOS, or BOS alone
  std::string context = rec.context;
  out->truncated = false;
  out->id = rec.id;
  out->label = label_code(rec.label);
  std::vector<uint32_t> ends;
  for (int attempt = 0;; ++attempt) {
    const std::string prompt = format.prompt(rec.question, context) + lead;
    const std::vector<int32_t> ids = tok.encode_with_ends(prompt + rec.answer + suffix, &ends);
    const int n = int(ids.size()) + specials;
    if (n <= max_tokens) {
      // The answer starts at the first token whose piece ends past the prompt's bytes (a piece
      // that straddles the boundary counts as answer: it carries answer text).
      size_t first = 0;
      while (first < ends.size() && ends[first] <= prompt.size()) ++first;
      out->tokens.clear();
      out->tokens.push_back(tok.bos_id());
      out->tokens.insert(out->tokens.end(), ids.begin(), ids.end());
      if (complete) out->tokens.push_back(tok.eos_id());
      out->answer_offset = int32_t(1 + first);
      // The decision: the label the answer ends with (--answer-field both, final_decision), from
      // the first token that ends past the text before it.
      out->decision_offset = -1;
      const std::string& label = rec.label;
      if (complete && !label.empty() && rec.answer.size() >= label.size() &&
          rec.answer.compare(rec.answer.size() - label.size(), label.size(), label) == 0) {
        const size_t before = prompt.size() + rec.answer.size() - label.size();
        size_t d = first;
        while (d < ends.size() && ends[d] <= before) ++d;
        out->decision_offset = int32_t(1 + d);
      }
      out->context = context;
      return true;
    }
    if (context.empty() || attempt == 16) return false;
    // Cut the context at a token boundary of this encoding: drop the overflow (plus one token of
    // slack for merges at the new boundary) from the tokens that lie inside the context's bytes,
    // then re-encode; a second pass is rarely needed.
    // The context's last occurrence that ends before the lead (the lead may repeat its words).
    const size_t head = prompt.size() - lead.size();
    const size_t ctx_begin = head >= context.size() ? prompt.rfind(context, head - context.size()) : std::string::npos;
    size_t last = 0;  // one past the last token that ends inside the context
    while (last < ends.size() && ends[last] <= ctx_begin + context.size()) ++last;
    size_t first = 0;  // the first token that ends inside the context
    while (first < last && ends[first] <= ctx_begin) ++first;
    const size_t drop = size_t(n - max_tokens) + 1;
    size_t keep = 0;
    if (ctx_begin != std::string::npos && last >= first + drop + 1) keep = ends[last - drop - 1] - ctx_begin;
    if (keep >= context.size()) keep = context.size() > 0 ? context.size() - 1 : 0;
    while (keep > 0 && (static_cast<unsigned char>(context[keep]) & 0xC0) == 0x80) --keep;
    context.resize(keep);
    out->truncated = true;
  }
}

TokenSplit pack_examples(const std::vector<QaExample>& examples, int seq_len, bool train_on_prompt,
                         int decision_weight) {
  const int cols = seq_len + 1;
  TokenSplit s;
  s.seq_len = seq_len;
  int used = cols;  // forces a new row for the first example
  for (const QaExample& e : examples) {
    const int len = int(e.tokens.size());
    LT_CHECK(len <= cols, "example ", e.id, " has ", len, " tokens, more than a row's ", cols);
    if (used + len > cols) {  // start a row, padded with token 0 / mask 0 / position 0
      s.tokens.resize(s.tokens.size() + size_t(cols), 0);
      s.loss_mask.resize(s.loss_mask.size() + size_t(cols), 0);
      s.positions.resize(s.positions.size() + size_t(cols), 0);
      ++s.n_seq;
      used = 0;
    }
    const size_t base = size_t(s.n_seq - 1) * cols + size_t(used);
    for (int j = 0; j < len; ++j) {
      s.tokens[base + j] = e.tokens[size_t(j)];
      s.positions[base + j] = j;
      // BOS is never a target (the token before it belongs to another example).
      s.loss_mask[base + j] = j > 0 && (train_on_prompt || j >= e.answer_offset) ? 1 : 0;
      if (e.decision_offset > 0 && j >= e.decision_offset) s.loss_mask[base + j] = uint8_t(decision_weight);
    }
    ExampleSpan span;
    span.row = s.n_seq - 1;
    span.offset = used;
    span.length = len;
    span.answer_offset = e.answer_offset;
    span.label = e.label;
    span.id = e.id;
    s.examples.push_back(std::move(span));
    used += len;
  }
  return s;
}

std::vector<QaRecord> load_qa_records(const std::string& source, const QaReadOptions& opt, QaReadReport* report) {
  const std::optional<std::string> builtin = builtin_qa_source(source);
  if (!builtin) return read_qa_file(source, opt, report);
  // The reader takes a path: the generated set is written out for the duration.
  TempFile file;
  file.path = temp_path_for("/tmp/llamatrain-factqa") + ".jsonl";
  write_file_atomic(file.path, *builtin);
  std::vector<QaRecord> records = read_qa_file(file.path, opt, report);
  for (auto& r : records) r.origin.replace(0, file.path.size(), source);
  return records;
}

namespace {

// The records, read, checked and given the answer text of --answer-field; invalid ones skipped
// (with --skip-invalid) are listed on stderr.
std::vector<QaRecord> read_prepare_records(const PrepareQaOptions& opt, QaReadReport* report,
                                           const IdList* test_ids) {
  QaReadOptions ropt;
  ropt.skip_invalid = opt.skip_invalid;
  std::vector<QaRecord> records = load_qa_records(opt.qa_path, ropt, report);
  if (test_ids != nullptr) check_listed_ids_present(*test_ids, opt.test_ids_path, records, opt.qa_path);
  select_answers(records, opt.answer_field, opt.skip_invalid, report);
  if (!opt.quiet && report->invalid > 0) {
    std::fprintf(stderr, "prepare: skipped %lld invalid record(s) (--skip-invalid):\n", (long long)report->invalid);
    for (const auto& p : report->problems) std::fprintf(stderr, "  %s\n", p.c_str());
  }
  if (records.empty()) fail(strcat(opt.qa_path, ": no valid records"));
  return records;
}

// The tokenizer: given, or trained on the formatted records with the format's markers as single pieces.
std::string prepare_qa_tokenizer(const PrepareQaOptions& opt, const std::vector<QaRecord>& records) {
  if (!opt.tokenizer_path.empty()) {
    if (!file_exists(opt.tokenizer_path)) fail(strcat(opt.tokenizer_path, ": tokenizer file not found (--tokenizer)"));
    return opt.tokenizer_path;
  }
  TempFile corpus;
  std::string text;
  for (const auto& r : records) text += record_text(r, opt.format) + "\n";
  corpus.path = temp_path_for(opt.output_path) + ".txt";
  write_file_atomic(corpus.path, text);
  TokenizerTrainOptions topt;
  topt.input_path = corpus.path;
  const std::string model_path = tokenizer_model_path_for(opt.output_path);
  topt.model_prefix = model_path.substr(0, model_path.size() - std::string(".model").size());
  topt.vocab_size = opt.vocab_size;
  topt.model_type = opt.model_type;
  topt.seed = opt.seed;
  topt.user_defined_symbols = opt.format.markers();
  if (!opt.quiet)
    std::fprintf(stderr, "prepare: training a %s tokenizer (vocab %d) on %zu formatted records\n",
                 opt.model_type.c_str(), opt.vocab_size, records.size());
  return train_tokenizer(topt);
}

// Every record tokenized on all threads (SentencePiece's Encode is const and thread-safe); those
// that do not fit --seq-len even without context are counted in result and left out.
std::vector<QaExample> tokenize_records(const PrepareQaOptions& opt, const Tokenizer& tok,
                                        const std::vector<QaRecord>& records, PrepareQaResult* result) {
  const int max_tokens = opt.seq_len + 1;
  std::vector<QaExample> examples(records.size());
  std::vector<char> fits(records.size(), 0);
  const auto t_tok = Clock::now();
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t i = 0; i < records.size(); ++i)
    fits[i] = tokenize_example(tok, records[i], opt.format, max_tokens, &examples[i]);
  const double tok_s = seconds_since(t_tok);
  // The yardstick, on request: SentencePiece alone, one thread, on the same formatted texts.
  if (opt.compare_sentencepiece) {
    int64_t sp_tokens = 0;
    const auto t_sp = Clock::now();
    for (const auto& r : records) sp_tokens += int64_t(tok.encode(record_text(r, opt.format), false, false).size());
    const double sp_s = seconds_since(t_sp);
    result->sp_tokens_per_s = sp_s > 0 ? double(sp_tokens) / sp_s : 0;
  }
  std::vector<QaExample> kept;
  for (size_t i = 0; i < records.size(); ++i) {
    if (!fits[i]) {
      ++result->too_long;
      continue;
    }
    result->truncated += examples[i].truncated;
    result->tokens += int64_t(examples[i].tokens.size());
    kept.push_back(std::move(examples[i]));
  }
  if (kept.empty()) fail(strcat(opt.qa_path, ": no record fits in --seq-len ", opt.seq_len, " even without its context"));
  result->tokens_per_s = tok_s > 0 ? double(result->tokens) / tok_s : 0;
  return kept;
}

// Held-out examples: those of the listed ids, or whole examples chosen by the seed (prepare.h split_rows).
void split_prepared(const PrepareQaOptions& opt, std::vector<QaExample> kept, const IdList* test_ids,
                    std::vector<QaExample>* train, std::vector<QaExample>* test, PrepareQaResult* result) {
  if (test_ids != nullptr) {
    split_examples_by_ids(std::move(kept), *test_ids, train, test, &result->test_ids);
    return;
  }
  const RowSplit split = split_rows(int64_t(kept.size()), opt.test_split, opt.seed);
  for (int64_t i : split.train) train->push_back(std::move(kept[size_t(i)]));
  for (int64_t i : split.test) test->push_back(std::move(kept[size_t(i)]));
}

DatasetInfo prepared_info(const PrepareQaOptions& opt, const Tokenizer& tok) {
  DatasetInfo info;
  info.seq_len = opt.seq_len;
  info.vocab_size = tok.vocab_size();
  info.bos_id = tok.bos_id();
  info.eos_id = tok.eos_id();
  info.tokenizer_sha256 = tok.sha256();
  const std::optional<std::string> builtin = builtin_qa_source(opt.qa_path);
  info.source_sha256 = builtin ? sha256_hex(*builtin) : sha256_file(opt.qa_path);
  info.source_path = opt.qa_path;
  info.prompt_template = opt.format.name();
  info.prompt_type = opt.format.prompt_type();
  info.prompt_format = opt.format.to_string();
  info.answer_field = answer_field_name(opt.answer_field);
  info.train_on_prompt = opt.train_on_prompt;
  info.decision_weight = opt.decision_weight;
  info.tool_version = LLAMATRAIN_VERSION;
  info.seed = opt.seed;
  info.test_split = opt.test_split;
  if (!opt.test_ids_path.empty()) {
    info.test_ids_path = opt.test_ids_path;
    info.test_ids_sha256 = sha256_file(opt.test_ids_path);
  }
  return info;
}

std::string prepared_report(const CurationReport& creport, const QaReadReport& rreport, const PrepareQaResult& result,
                            bool test_ids) {
  nlohmann::json report = nlohmann::json::parse(creport.to_json());
  report["format"] = rreport.format;
  report["records"] = rreport.records;
  report["invalid_skipped"] = rreport.invalid;
  report["dropped"]["too_long"] = result.too_long;
  report["truncated_context"] = result.truncated;
  report["train_examples"] = result.train_examples;
  report["test_examples"] = result.test_examples;
  if (test_ids)
    report["test_ids"] = {{"listed", result.test_ids.listed}, {"in_test", result.test_ids.in_test},
                          {"dropped", result.test_ids.dropped}};
  return report.dump();
}

void print_prepare_summary(const PrepareQaOptions& opt, const QaReadReport& rreport, const CurationReport& creport,
                           const PrepareQaResult& result, const Dataset& d, int64_t train_tokens) {
  std::fprintf(stderr, "prepare: %s: %lld records (%s), %lld kept after curation, dropped %lld duplicate(s), "
               "%lld short answer(s), %lld too long; %lld context(s) truncated to fit --seq-len %d\n",
               opt.qa_path.c_str(), (long long)rreport.records, rreport.format.c_str(), (long long)creport.kept,
               (long long)creport.duplicates, (long long)creport.short_answers, (long long)result.too_long,
               (long long)result.truncated, opt.seq_len);
  if (!opt.test_ids_path.empty()) {
    const TestIdsReport& t = result.test_ids;
    std::fprintf(stderr, "prepare: --test-ids %s: %lld ids listed, %lld in the test split, %lld dropped (curation "
                 "or --seq-len)%s", opt.test_ids_path.c_str(), (long long)t.listed, (long long)t.in_test,
                 (long long)t.dropped, t.dropped_ids.empty() ? "" : ": ");
    for (size_t i = 0; i < t.dropped_ids.size() && i < 5; ++i)
      std::fprintf(stderr, "%s%s", i ? ", " : "", t.dropped_ids[i].c_str());
    std::fprintf(stderr, "%s\n", t.dropped_ids.size() > 5 ? ", ..." : "");
  }
  std::fprintf(stderr, "prepare: %lld train / %lld test examples packed into %lld / %lld rows of %d tokens "
               "(%.1f%% of train slots used), %s layout, answers: %s, loss on %s\n",
               (long long)result.train_examples, (long long)result.test_examples, (long long)d.train.n_seq,
               (long long)d.test.n_seq, opt.seq_len + 1,
               d.train.n_seq ? 100.0 * double(train_tokens) / double(d.train.n_seq * (opt.seq_len + 1)) : 0.0,
               opt.format.name().c_str(), answer_field_name(opt.answer_field),
               opt.train_on_prompt ? "prompt and answer" : "answers and EOS");
  if (opt.decision_weight > 1)
    std::fprintf(stderr, "prepare: each answer's decision (its label and the answer's end) weighs %d in the loss\n",
                 opt.decision_weight);
  std::fprintf(stderr, "prepare: tokenized %lld tokens at %.0f tokens/s (%d threads)", (long long)result.tokens,
               result.tokens_per_s, omp_get_max_threads());
  if (opt.compare_sentencepiece)
    std::fprintf(stderr, "; SentencePiece alone, one thread, on the same texts: %.0f tokens/s (ratio %.2f)",
                 result.sp_tokens_per_s, result.sp_tokens_per_s > 0 ? result.tokens_per_s / result.sp_tokens_per_s : 0.0);
  std::fputc('\n', stderr);
  std::fprintf(stderr, "prepare: wrote %s (tokenizer %s) in %.1f s\n", opt.output_path.c_str(),
               result.tokenizer_path.c_str(), result.seconds);
}

}  // namespace

PrepareQaResult prepare_qa(const PrepareQaOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.seq_len < 8) fail(strcat("--seq-len ", opt.seq_len, ": expected at least 8 for question/answer data"));
  if (!(opt.test_split >= 0 && opt.test_split < 1)) fail(strcat("--test-split ", opt.test_split, ": expected [0, 1)"));
  if (opt.min_answer_tokens < 0) fail(strcat("--min-answer-tokens ", opt.min_answer_tokens, ": expected >= 0"));
  if (opt.decision_weight < 1 || opt.decision_weight > 255)
    fail(strcat("--decision-weight ", opt.decision_weight, ": expected an integer in [1, 255]"));
  if (opt.decision_weight > 1 && opt.answer_field == AnswerField::kLongAnswer)
    fail(strcat("--decision-weight ", opt.decision_weight, " needs answers that end with their decision: "
                "--answer-field both or final_decision"));
  if (!opt.test_ids_path.empty() && opt.test_split != 0)
    fail(strcat("--test-ids ", opt.test_ids_path, " and --test-split ", opt.test_split,
                " both choose the test split; choose one"));
  PrepareQaResult result;
  std::optional<IdList> test_ids;
  if (!opt.test_ids_path.empty()) test_ids = read_id_file(opt.test_ids_path);

  QaReadReport rreport;
  std::vector<QaRecord> records = read_prepare_records(opt, &rreport, test_ids ? &*test_ids : nullptr);
  result.records = rreport.records;
  result.invalid = rreport.invalid;
  result.tokenizer_path = prepare_qa_tokenizer(opt, records);
  const Tokenizer tok = Tokenizer::load(result.tokenizer_path);

  CurationOptions copt;
  copt.min_answer_tokens = opt.min_answer_tokens;
  CurationReport creport;
  records = curate(std::move(records), copt,
                   [&](const std::string& a) { return int(tok.encode(a, false, false).size()); }, &creport);
  result.kept = creport.kept;
  if (records.empty()) fail(strcat(opt.qa_path, ": every record was dropped by curation: ", creport.to_json()));

  std::vector<QaExample> train_ex, test_ex;
  split_prepared(opt, tokenize_records(opt, tok, records, &result), test_ids ? &*test_ids : nullptr, &train_ex,
                 &test_ex, &result);
  result.train_examples = int64_t(train_ex.size());
  result.test_examples = int64_t(test_ex.size());
  if (test_ids && train_ex.empty())
    fail(strcat("--test-ids ", opt.test_ids_path, ": the listed ids cover all ", test_ex.size(),
                " examples kept from ", opt.qa_path, "; none is left to train on"));
  if (test_ids && test_ex.empty())
    fail(strcat("--test-ids ", opt.test_ids_path, ": none of the ", result.test_ids.listed,
                " listed ids is left for the test split: all were dropped (curation or --seq-len ", opt.seq_len,
                "), e.g. ", quoted_ids(result.test_ids.dropped_ids)));

  Dataset d;
  d.info = prepared_info(opt, tok);
  d.info.curation_report = prepared_report(creport, rreport, result, test_ids.has_value());
  result.report_json = d.info.curation_report;
  d.tokenizer_model = tok.serialized();
  d.train = pack_examples(train_ex, opt.seq_len, opt.train_on_prompt, opt.decision_weight);
  d.test = pack_examples(test_ex, opt.seq_len, opt.train_on_prompt, opt.decision_weight);
  d.save(opt.output_path);

  result.train_rows = d.train.n_seq;
  result.test_rows = d.test.n_seq;
  result.seconds = seconds_since(t0);
  int64_t train_tokens = 0;
  for (const auto& e : train_ex) train_tokens += int64_t(e.tokens.size());
  if (!opt.quiet) print_prepare_summary(opt, rreport, creport, result, d, train_tokens);
  return result;
}

}  // namespace lt
