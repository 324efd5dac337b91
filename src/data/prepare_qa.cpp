// `llamatrain prepare --qa`: records -> curated, prompt-formatted, tokenized examples with an
// answer-only loss mask -> rows packed without splitting an example -> HDF5 (dataset.h).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

const char* template_name(int type) {
  switch (type) {
    case 1: return "alpaca";
    case 2: return "qa-inline-markers";
    default: return "qa-section-markers";
  }
}

std::string record_text(const QaRecord& r, int type) {
  return prompt_text(type, r.question, r.context) + r.answer + answer_suffix(type);
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

bool tokenize_example(const Tokenizer& tok, const QaRecord& rec, int prompt_type, int max_tokens,
                      QaExample* out, bool complete) {
  const std::string suffix = complete ? answer_suffix(prompt_type) : std::string();
  const int specials = complete ? 2 : 1;  // BOS and EOS, or BOS alone
  std::string context = rec.context;
  out->truncated = false;
  out->id = rec.id;
  out->label = label_code(rec.label);
  std::vector<uint32_t> ends;
  for (int attempt = 0;; ++attempt) {
    const std::string prompt = prompt_text(prompt_type, rec.question, context);
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
      return true;
    }
    if (context.empty() || attempt == 16) return false;
    // Cut the context at a token boundary of this encoding: drop the overflow (plus one token of
    // slack for merges at the new boundary) from the tokens that lie inside the context's bytes,
    // then re-encode; a second pass is rarely needed.
    const size_t ctx_begin = prompt.rfind(context);
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

TokenSplit pack_examples(const std::vector<QaExample>& examples, int seq_len, bool train_on_prompt) {
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
  if (source != kBuiltinQaName) return read_qa_file(source, opt, report);
  // The reader takes a path: the generated set is written out for the duration.
  TempFile file;
  file.path = temp_path_for("/tmp/llamatrain-factqa") + ".jsonl";
  write_file_atomic(file.path, builtin_qa_jsonl());
  std::vector<QaRecord> records = read_qa_file(file.path, opt, report);
  for (auto& r : records) r.origin.replace(0, file.path.size(), source);
  return records;
}

PrepareQaResult prepare_qa(const PrepareQaOptions& opt) {
  const auto t0 = Clock::now();
  check_prompt_type(opt.prompt_type);
  if (opt.seq_len < 8) fail(strcat("--seq-len ", opt.seq_len, ": expected at least 8 for question/answer data"));
  if (!(opt.test_split >= 0 && opt.test_split < 1)) fail(strcat("--test-split ", opt.test_split, ": expected [0, 1)"));
  if (opt.min_answer_tokens < 0) fail(strcat("--min-answer-tokens ", opt.min_answer_tokens, ": expected >= 0"));
  PrepareQaResult result;

  QaReadOptions ropt;
  ropt.skip_invalid = opt.skip_invalid;
  QaReadReport rreport;
  std::vector<QaRecord> records = load_qa_records(opt.qa_path, ropt, &rreport);
  result.records = rreport.records;
  result.invalid = rreport.invalid;
  if (!opt.quiet && rreport.invalid > 0) {
    std::fprintf(stderr, "prepare: skipped %lld invalid record(s) (--skip-invalid):\n", (long long)rreport.invalid);
    for (const auto& p : rreport.problems) std::fprintf(stderr, "  %s\n", p.c_str());
  }
  if (records.empty()) fail(strcat(opt.qa_path, ": no valid records"));

  // The tokenizer: given, or trained on the formatted records with the markers as single pieces.
  std::string tokenizer_path = opt.tokenizer_path;
  if (tokenizer_path.empty()) {
    TempFile corpus;
    std::string text;
    for (const auto& r : records) text += record_text(r, opt.prompt_type) + "\n";
    corpus.path = temp_path_for(opt.output_path) + ".txt";
    write_file_atomic(corpus.path, text);
    TokenizerTrainOptions topt;
    topt.input_path = corpus.path;
    const std::string model_path = tokenizer_model_path_for(opt.output_path);
    topt.model_prefix = model_path.substr(0, model_path.size() - std::string(".model").size());
    topt.vocab_size = opt.vocab_size;
    topt.model_type = opt.model_type;
    topt.seed = opt.seed;
    topt.user_defined_symbols = prompt_markers(opt.prompt_type);
    if (!opt.quiet)
      std::fprintf(stderr, "prepare: training a %s tokenizer (vocab %d) on %zu formatted records\n",
                   opt.model_type.c_str(), opt.vocab_size, records.size());
    tokenizer_path = train_tokenizer(topt);
  } else if (!file_exists(tokenizer_path)) {
    fail(strcat(tokenizer_path, ": tokenizer file not found (--tokenizer)"));
  }
  const Tokenizer tok = Tokenizer::load(tokenizer_path);
  result.tokenizer_path = tokenizer_path;

  CurationOptions copt;
  copt.min_answer_tokens = opt.min_answer_tokens;
  CurationReport creport;
  records = curate(std::move(records), copt,
                   [&](const std::string& a) { return int(tok.encode(a, false, false).size()); }, &creport);
  result.kept = creport.kept;
  if (records.empty()) fail(strcat(opt.qa_path, ": every record was dropped by curation: ", creport.to_json()));

  // Tokenize every record on all threads; SentencePiece's Encode is const and thread-safe.
  const int max_tokens = opt.seq_len + 1;
  std::vector<QaExample> examples(records.size());
  std::vector<char> fits(records.size(), 0);
  const auto t_tok = Clock::now();
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t i = 0; i < records.size(); ++i)
    fits[i] = tokenize_example(tok, records[i], opt.prompt_type, max_tokens, &examples[i]);
  const double tok_s = seconds_since(t_tok);
  // The yardstick, on request: SentencePiece alone, one thread, on the same formatted texts.
  double sp_s = 0;
  int64_t sp_tokens = 0;
  if (opt.compare_sentencepiece) {
    const auto t_sp = Clock::now();
    for (const auto& r : records) sp_tokens += int64_t(tok.encode(record_text(r, opt.prompt_type), false, false).size());
    sp_s = seconds_since(t_sp);
  }

  std::vector<QaExample> kept;
  std::vector<std::string> too_long;
  for (size_t i = 0; i < records.size(); ++i) {
    if (!fits[i]) {
      too_long.push_back(records[i].origin);
      continue;
    }
    result.truncated += examples[i].truncated;
    result.tokens += int64_t(examples[i].tokens.size());
    kept.push_back(std::move(examples[i]));
  }
  result.too_long = int64_t(too_long.size());
  if (kept.empty()) fail(strcat(opt.qa_path, ": no record fits in --seq-len ", opt.seq_len, " even without its context"));
  result.tokens_per_s = tok_s > 0 ? double(result.tokens) / tok_s : 0;
  result.sp_tokens_per_s = sp_s > 0 ? double(sp_tokens) / sp_s : 0;

  // Held-out examples: whole examples, chosen by the seed (prepare.h split_rows).
  const RowSplit split = split_rows(int64_t(kept.size()), opt.test_split, opt.seed);
  std::vector<QaExample> train_ex, test_ex;
  for (int64_t i : split.train) train_ex.push_back(kept[size_t(i)]);
  for (int64_t i : split.test) test_ex.push_back(kept[size_t(i)]);

  Dataset d;
  d.info.seq_len = opt.seq_len;
  d.info.vocab_size = tok.vocab_size();
  d.info.bos_id = tok.bos_id();
  d.info.eos_id = tok.eos_id();
  d.info.tokenizer_sha256 = tok.sha256();
  d.info.source_sha256 = opt.qa_path == kBuiltinQaName ? sha256_hex(builtin_qa_jsonl()) : sha256_file(opt.qa_path);
  d.info.source_path = opt.qa_path;
  d.info.prompt_template = template_name(opt.prompt_type);
  d.info.prompt_type = opt.prompt_type;
  d.info.train_on_prompt = opt.train_on_prompt;
  d.info.tool_version = LLAMATRAIN_VERSION;
  d.info.seed = opt.seed;
  d.info.test_split = opt.test_split;
  nlohmann::json report = nlohmann::json::parse(creport.to_json());
  report["format"] = rreport.format;
  report["records"] = rreport.records;
  report["invalid_skipped"] = rreport.invalid;
  report["dropped"]["too_long"] = result.too_long;
  report["truncated_context"] = result.truncated;
  report["train_examples"] = train_ex.size();
  report["test_examples"] = test_ex.size();
  d.info.curation_report = report.dump();
  result.report_json = d.info.curation_report;
  d.tokenizer_model = tok.serialized();
  d.train = pack_examples(train_ex, opt.seq_len, opt.train_on_prompt);
  d.test = pack_examples(test_ex, opt.seq_len, opt.train_on_prompt);
  d.save(opt.output_path);

  result.train_examples = int64_t(train_ex.size());
  result.test_examples = int64_t(test_ex.size());
  result.train_rows = d.train.n_seq;
  result.test_rows = d.test.n_seq;
  result.seconds = seconds_since(t0);
  if (!opt.quiet) {
    int64_t train_tokens = 0;
    for (const auto& e : train_ex) train_tokens += int64_t(e.tokens.size());
    std::fprintf(stderr, "prepare: %s: %lld records (%s), %lld kept after curation, dropped %lld duplicate(s), "
                 "%lld short answer(s), %lld too long; %lld context(s) truncated to fit --seq-len %d\n",
                 opt.qa_path.c_str(), (long long)rreport.records, rreport.format.c_str(), (long long)creport.kept,
                 (long long)creport.duplicates, (long long)creport.short_answers, (long long)result.too_long,
                 (long long)result.truncated, opt.seq_len);
    std::fprintf(stderr, "prepare: %lld train / %lld test examples packed into %lld / %lld rows of %d tokens "
                 "(%.1f%% of train slots used), %s layout, loss on %s\n",
                 (long long)result.train_examples, (long long)result.test_examples, (long long)d.train.n_seq,
                 (long long)d.test.n_seq, opt.seq_len + 1,
                 d.train.n_seq ? 100.0 * double(train_tokens) / double(d.train.n_seq * (opt.seq_len + 1)) : 0.0,
                 template_name(opt.prompt_type), opt.train_on_prompt ? "prompt and answer" : "answers and EOS");
    std::fprintf(stderr, "prepare: tokenized %lld tokens at %.0f tokens/s (%d threads)", (long long)result.tokens,
                 result.tokens_per_s, omp_get_max_threads());
    if (opt.compare_sentencepiece)
      std::fprintf(stderr, "; SentencePiece alone, one thread, on the same texts: %.0f tokens/s (ratio %.2f)",
                   result.sp_tokens_per_s, result.sp_tokens_per_s > 0 ? result.tokens_per_s / result.sp_tokens_per_s : 0.0);
    std::fputc('\n', stderr);
    std::fprintf(stderr, "prepare: wrote %s (tokenizer %s) in %.1f s\n", opt.output_path.c_str(),
                 tokenizer_path.c_str(), result.seconds);
  }
  return result;
}

}  // namespace lt
