#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/eval_task.h"
#include "cli/ranges.h"
#include "llamatrain/dataset.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/memory.h"
#include "llamatrain/model.h"
#include "llamatrain/plan.h"
#include "llamatrain/progress.h"
#include "llamatrain/trainer.h"
#include "llamatrain/utf8.h"

namespace lt::cli {

CLI::App* setup_eval(CLI::App& root, EvalOptions& opt) {
  CLI::App* sub = root.add_subcommand(
      "eval", "Mean next-token cross-entropy and perplexity of a model on a text file or a prepared dataset");
  sub->add_option("--model", opt.model, "Model: HDF5 file, llama2.c .bin, HF directory, or a training checkpoint (DIR/step-N, or DIR / DIR/latest for the newest usable one)")->required();
  sub->add_option("--tokenizer", opt.tokenizer, "SentencePiece .model (default: the one stored in the model or checkpoint)");
  sub->add_option("--lora", opt.lora,
                  "A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) for the model: "
                  "applied unmerged to the loss (--text, --data; the CPU in fp32), merged into the weights in memory "
                  "for --task");
  auto* text = sub->add_option("--text", opt.text, "Plain text, tokenized as one stream with one BOS first");
  auto* data = sub->add_option("--data", opt.data, "Dataset made by `llamatrain prepare`");
  auto* task = sub->add_option("--task", opt.task,
                               "pubmedqa: yes/no/maybe accuracy and macro-F1 on --qa records, each answer "
                               "scored by the log-likelihood of its continuation after the prompt")
                   ->check(CLI::IsMember({"pubmedqa"}));
  text->excludes(data);
  task->excludes(text)->excludes(data);
  sub->add_option("--qa", opt.qa, "--task: records (JSONL, JSON array, ori_pqal.json, builtin:factqa, builtin:factqa:N)");
  sub->add_option("--ids", opt.ids,
                  "--task: evaluate only these ids: a JSON object {id: label} (e.g. test_ground_truth.json), "
                  "a JSON array of ids, one id per line, or a dataset made by prepare --qa (its test split, "
                  "scored in the prompt format and answer field it was prepared with)");
  add_prompt_options(sub, opt.prompt, "--task: ", "prompt layout 1|2|3, as in prepare (default: the --ids "
                     "dataset's, else 1)");
  sub->add_option("--answer-field", opt.answer_field,
                  "--task: what the model was trained to answer, as in prepare (default: the --ids dataset's, else "
                  "long_answer); with both it writes the long answer first and the decision is scored after "
                  "\"Final decision: \"")
      ->check(CLI::IsMember({"long_answer", "final_decision", "both"}));
  sub->add_flag("--allow-trained-ids", opt.allow_trained_ids,
                "--task: score ids that are in the train split of the model's training data (refused otherwise), "
                "with a warning");
  sub->add_option("--split", opt.split, "Dataset split for --data")->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  in_range(
      sub->add_option("--seq-len", opt.seq_len, "Window length L for --text: windows of L+1 tokens overlapping by one"),
      ints_from(1));
  in_range(sub->add_option("--batch-size", opt.batch_size, "Sequences per forward pass")->capture_default_str(),
           ints_from(1));
  sub->add_flag("!--no-progress", opt.progress,
                "No progress on stderr (otherwise a live line on a terminal, a plain line every 30 s in a log)");
  add_device_choice(sub, opt.device,
                    "Where the forward passes run: auto (a GPU when one is visible, else the CPU), cpu, cuda, or "
                    "cuda-sim (the CUDA backend with its kernels in the CPU simulator; slow, for tests)");
  add_precision_choice(sub, opt.precision,
                       "The CPU's matrix-product operands: fp32 (the reference) or bf16 (oneDNN with fp32 accumulation; "
                       "fast only on CPUs with AMX); a CUDA device computes in bf16");
  sub->add_flag("--json", opt.json, R"(Print exactly one JSON object {"loss":…,"perplexity":…,"tokens":…} on stdout)");
  return sub;
}

Progress eval_progress(const EvalOptions& opt, const std::string& label, int64_t total, const char* unit) {
  return Progress(label, total, unit, opt.progress ? 0.0 : 1e30);
}

namespace {

// Windows of L+1 tokens overlapping by one: window i is tokens[i*L .. i*L+L]; the last shorter
// window counts when it has at least 2 tokens. Full windows are batched.
double eval_text_stream(Evaluator& model, const std::vector<int32_t>& tokens, int L, int batch_size,
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

// The activations of one batch of b rows of T tokens (the forward pass keeps what training would).
void check_eval_memory(const Llama2Config& cfg, int b, int T) {
  check_memory_fits(plan_activation_bytes(cfg, b, T, Recompute::kNone, 4),
                    strcat("eval: batches of ", b, " x ", T, " tokens"), "use a smaller --batch-size");
}

}  // namespace

int run_eval(const EvalOptions& opt) {
  if (!opt.task.empty()) return run_eval_task(opt);
  if (opt.text.empty() && opt.data.empty()) fail("eval: give --text FILE, --data DATA.h5 or --task pubmedqa");
  if (opt.batch_size <= 0) fail(strcat("eval: --batch-size ", opt.batch_size, ", expected > 0"));
  ModelData md = load_model_noting("eval", opt.model);
  const Llama2Config cfg = md.config;
  Llama2Model host(cfg);
  host.params() = std::move(md.params);
  if (!opt.lora.empty()) attach_lora_dir("eval", opt.lora, host);
  const std::unique_ptr<Evaluator> model = evaluator_on("eval", opt.device, host, opt.precision);

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
    loss_sum = eval_text_stream(*model, tokens, opt.seq_len, opt.batch_size, &count, progress);
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
    loss_sum = evaluate_split(*model, split, opt.batch_size, &count, [&](int64_t done) { progress.update(done); });
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
