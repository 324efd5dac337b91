#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranges.h"
#include "llamatrain/dataset.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/json_read.h"
#include "llamatrain/memory.h"
#include "llamatrain/model.h"
#include "llamatrain/plan.h"
#include "llamatrain/prepare.h"
#include "llamatrain/progress.h"
#include "llamatrain/qa.h"
#include "llamatrain/qa_eval.h"
#include "llamatrain/trainer.h"
#include "llamatrain/utf8.h"

namespace lt::cli {

CLI::App* setup_eval(CLI::App& root, EvalOptions& opt) {
  CLI::App* sub = root.add_subcommand(
      "eval", "Mean next-token cross-entropy and perplexity of a model on a text file or a prepared dataset");
  sub->add_option("--model", opt.model, "Model: HDF5 file, llama2.c .bin, HF directory, or a training checkpoint (DIR/step-N, or DIR / DIR/latest for the newest usable one)")->required();
  sub->add_option("--tokenizer", opt.tokenizer, "SentencePiece .model (default: the one stored in the model or checkpoint)");
  auto* text = sub->add_option("--text", opt.text, "Plain text, tokenized as one stream with one BOS first");
  auto* data = sub->add_option("--data", opt.data, "Dataset made by `llamatrain prepare`");
  auto* task = sub->add_option("--task", opt.task,
                               "pubmedqa: yes/no/maybe accuracy and macro-F1 on --qa records, each answer "
                               "scored by the log-likelihood of its continuation after the prompt")
                   ->check(CLI::IsMember({"pubmedqa"}));
  text->excludes(data);
  task->excludes(text)->excludes(data);
  sub->add_option("--qa", opt.qa, "--task: records (JSONL, JSON array, ori_pqal.json, builtin:factqa)");
  sub->add_option("--ids", opt.ids,
                  "--task: evaluate only these ids: a JSON object {id: label} (e.g. test_ground_truth.json), "
                  "a JSON array of ids, or a dataset made by prepare --qa (its test split)");
  // A range, not a member list: an empty value (--prompt-type '') is refused, not read as 0.
  in_range(sub->add_option("--prompt-type", opt.prompt_type, "--task: prompt layout 1|2|3, as in prepare")
               ->capture_default_str(),
           ints_between(1, 3));
  sub->add_option("--split", opt.split, "Dataset split for --data")->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  in_range(
      sub->add_option("--seq-len", opt.seq_len, "Window length L for --text: windows of L+1 tokens overlapping by one"),
      ints_from(1));
  in_range(sub->add_option("--batch-size", opt.batch_size, "Sequences per forward pass")->capture_default_str(),
           ints_from(1));
  sub->add_flag("!--no-progress", opt.progress,
                "No progress on stderr (otherwise a live line on a terminal, a plain line every 30 s in a log)");
  sub->add_option("--precision", opt.precision,
                  "Matrix-product operands: fp32 (the reference) or bf16 (oneDNN with fp32 accumulation; fast only "
                  "on CPUs with AMX)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  sub->add_flag("--json", opt.json, R"(Print exactly one JSON object {"loss":…,"perplexity":…,"tokens":…} on stdout)");
  return sub;
}

namespace {

// Progress on stderr as train shows it: from the start, redrawn on a terminal, a plain line every
// 30 s in a log; with --no-progress never (the delay never passes).
Progress eval_progress(const EvalOptions& opt, const std::string& label, int64_t total, const char* unit) {
  return Progress(label, total, unit, opt.progress ? 0.0 : 1e30);
}

// Windows of L+1 tokens overlapping by one: window i is tokens[i*L .. i*L+L]; the last shorter
// window counts when it has at least 2 tokens. Full windows are batched.
double eval_text_stream(Llama2Model& model, const std::vector<int32_t>& tokens, int L, int batch_size,
                        int64_t* count, Progress& progress) {
  const int64_t n = int64_t(tokens.size());
  double loss_sum = 0;
  *count = 0;
  std::vector<int32_t> in, tg;
  auto run = [&](const std::vector<int64_t>& starts, int T) {
    const int B = int(starts.size());
    in.resize(size_t(B) * T);
    tg.resize(size_t(B) * T);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        in[size_t(b) * T + t] = tokens[size_t(starts[size_t(b)] + t)];
        tg[size_t(b) * T + t] = tokens[size_t(starts[size_t(b)] + t + 1)];
      }
    progress.update(*count);
    Batch batch;
    batch.B = B;
    batch.T = T;
    batch.inputs = in.data();
    batch.targets = tg.data();
    loss_sum += model.forward(batch);
    *count += int64_t(B) * T;
  };
  std::vector<int64_t> full;
  int64_t start = 0;
  for (; start + L < n; start += L) {  // full windows: L+1 tokens available
    full.push_back(start);
    if (int(full.size()) == batch_size) {
      run(full, L);
      full.clear();
    }
  }
  if (!full.empty()) run(full, L);
  if (n - start >= 2) run({start}, int(n - start - 1));
  return loss_sum;
}

// The records to score: --qa, restricted to --ids (whose labels, when given, are the truth).
std::vector<QaRecord> task_records(const EvalOptions& opt) {
  if (opt.qa.empty()) fail("eval --task: --qa FILE is required");
  QaReadReport report;
  std::vector<QaRecord> records = load_qa_records(opt.qa, QaReadOptions{}, &report);
  if (opt.ids.empty()) return records;
  std::map<std::string, std::string> wanted;  // id -> label ("" keeps the record's own)
  if (h5::is_hdf5_file(opt.ids)) {
    const Dataset ds = Dataset::load(opt.ids);
    if (ds.test.examples.empty()) fail(strcat(opt.ids, ": the dataset has no test examples with ids"));
    for (const auto& e : ds.test.examples) wanted[e.id] = "";
  } else {
    const nlohmann::json j = parse_json_file_text(read_file_bytes(opt.ids), opt.ids);
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!it.value().is_string()) fail(strcat(opt.ids, ": the label of id ", it.key(), " is not a string"));
        wanted[it.key()] = it.value().get<std::string>();
      }
    } else if (j.is_array()) {
      for (const auto& v : j) wanted[v.is_string() ? v.get<std::string>() : v.dump()] = "";
    } else {
      fail(strcat(opt.ids, ": expected a JSON object {id: label} or an array of ids"));
    }
  }
  std::vector<QaRecord> out;
  for (auto& r : records) {
    auto it = wanted.find(r.id);
    if (it == wanted.end()) continue;
    if (!it->second.empty()) r.label = it->second;
    out.push_back(std::move(r));
    wanted.erase(it);
  }
  if (!wanted.empty())
    fail(strcat(opt.ids, ": ", wanted.size(), " id(s) not found in ", opt.qa, ", e.g. '", wanted.begin()->first, "'"));
  return out;
}

// The activations of one batch of b rows of T tokens (the forward pass keeps what training would).
void check_eval_memory(const Llama2Config& cfg, int b, int T) {
  check_memory_fits(plan_activation_bytes(cfg, b, T, Recompute::kNone, 4),
                    strcat("eval: batches of ", b, " x ", T, " tokens"), "use a smaller --batch-size");
}

int run_task(const EvalOptions& opt) {
  LoadedModel loaded = load_model_and_tokenizer("eval", opt.model, opt.tokenizer);
  Llama2Model& model = loaded.model;
  set_cpu_precision(model, parse_precision(opt.precision), "eval", true);
  const Tokenizer& tok = loaded.tokenizer;
  const std::vector<QaRecord> records = task_records(opt);
  Progress progress = eval_progress(opt, "eval " + opt.task, int64_t(records.size()), "records");
  const QaEvalResult r =
      evaluate_yes_no_maybe(model, tok, records, opt.prompt_type, [&](int64_t done) { progress.update(done); });
  progress.finish();
  if (r.examples == 0) fail(strcat("eval --task ", opt.task, ": none of ", records.size(), " records has a yes/no/maybe label"));
  if (opt.json) {
    std::printf("%s\n", r.to_json().c_str());
    return 0;
  }
  std::printf("%s: %lld examples, accuracy %.4f, macro-F1 %.4f (skipped %lld, contexts truncated %lld)\n",
              opt.task.c_str(), (long long)r.examples, r.accuracy, r.macro_f1, (long long)r.skipped,
              (long long)r.truncated);
  std::printf("confusion (rows: truth, columns: predicted yes/no/maybe):\n");
  const char* names[3] = {"yes", "no", "maybe"};
  for (int t = 0; t < 3; ++t)
    std::printf("  %-5s %6lld %6lld %6lld\n", names[t], (long long)r.confusion[size_t(t)][0],
                (long long)r.confusion[size_t(t)][1], (long long)r.confusion[size_t(t)][2]);
  return 0;
}

}  // namespace

int run_eval(const EvalOptions& opt) {
  if (!opt.task.empty()) return run_task(opt);
  if (opt.text.empty() && opt.data.empty()) fail("eval: give --text FILE, --data DATA.h5 or --task pubmedqa");
  if (opt.batch_size <= 0) fail(strcat("eval: --batch-size ", opt.batch_size, ", expected > 0"));
  ModelData md = load_model_noting("eval", opt.model);
  const Llama2Config cfg = md.config;
  Llama2Model model(cfg);
  model.params() = std::move(md.params);
  set_cpu_precision(model, parse_precision(opt.precision), "eval", true);

  double loss_sum = 0;
  int64_t count = 0;
  if (!opt.text.empty()) {
    if (opt.seq_len <= 0) fail("eval: --seq-len L (> 0) is required with --text");
    if (opt.seq_len > cfg.max_seq_len)
      fail(strcat("eval: --seq-len ", opt.seq_len, " exceeds the maximum sequence length ", cfg.max_seq_len,
                  " of ", opt.model));
    const Tokenizer tok = tokenizer_for(opt.tokenizer, md, opt.model);
    check_tokenizer_fits(tok, opt.tokenizer.empty() ? opt.model : opt.tokenizer, cfg, opt.model);
    if (!file_exists(opt.text)) fail(strcat(opt.text, ": text file not found (--text)"));
    refuse_special_file(opt.text, "text file (--text)");
    const std::string text = read_file_bytes(opt.text);
    check_utf8(text, opt.text, "convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)");
    check_eval_memory(cfg, opt.batch_size, opt.seq_len);
    const std::vector<int32_t> tokens = tok.encode(text, true, false);
    if (tokens.size() < 2) fail(strcat(opt.text, ": fewer than 2 tokens, nothing to predict"));
    Progress progress = eval_progress(opt, "eval", int64_t(tokens.size()) - 1, "tokens");
    loss_sum = eval_text_stream(model, tokens, opt.seq_len, opt.batch_size, &count, progress);
    progress.finish();
  } else {
    const Dataset ds = Dataset::load(opt.data);
    // The model's tokenizer: stored in it, else --tokenizer. When neither says, the data's
    // tokenizer cannot be checked: a warning, not a refusal (eval changes nothing).
    std::string model_tokenizer = md.tokenizer_model;
    if (model_tokenizer.empty() && !opt.tokenizer.empty()) {
      if (!file_exists(opt.tokenizer)) fail(strcat(opt.tokenizer, ": tokenizer file not found (--tokenizer)"));
      refuse_special_file(opt.tokenizer, "tokenizer file (--tokenizer)");
      model_tokenizer = Tokenizer::load(opt.tokenizer).serialized();
    }
    check_data_fits_model(ds, cfg, model_tokenizer, opt.model,
                          model_tokenizer.empty() ? TokenizerCheck::kWarn : TokenizerCheck::kStrict);
    const TokenSplit& split = opt.split == "train" ? ds.train : ds.test;
    if (split.n_seq == 0) fail(strcat(opt.data, ": the ", opt.split, " split is empty"));
    if (split.loss_tokens() == 0)
      fail(strcat(opt.data, ": /", opt.split, "/loss_mask is all zeros: no token of the ", opt.split,
                  " split carries loss, so there is no loss to report"));
    check_eval_memory(cfg, opt.batch_size, split.seq_len);
    Progress progress = eval_progress(opt, "eval " + opt.split, split.n_seq, "sequences");
    loss_sum = evaluate_split(model, split, opt.batch_size, &count, [&](int64_t done) { progress.update(done); });
    progress.finish();
    if (count == 0) fail(strcat(opt.data, ": the ", opt.split, " split has no tokens with loss"));
  }
  const double loss = loss_sum / double(count);
  const double ppl = std::exp(loss);
  if (opt.json) {
    std::printf("%s\n", nlohmann::json({{"loss", loss}, {"perplexity", ppl}, {"tokens", count}}).dump().c_str());
  } else {
    std::printf("loss %.6f  perplexity %.4f  tokens %lld\n", loss, ppl, (long long)count);
  }
  return 0;
}

}  // namespace lt::cli
