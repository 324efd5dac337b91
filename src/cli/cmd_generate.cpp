#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backend/cpu/onednn/bf16.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranges.h"
#include "llamatrain/device.h"
#include "llamatrain/engine.h"
#include "llamatrain/error.h"
#include "llamatrain/inference.h"
#include "llamatrain/memory.h"
#include "llamatrain/model.h"
#include "llamatrain/qa.h"
#include "llamatrain/runtime.h"
#include "llamatrain/utf8.h"

namespace lt::cli {

CLI::App* setup_generate(CLI::App& root, GenerateOptions& opt) {
  CLI::App* sub = root.add_subcommand("generate", "Continue a prompt with a model (stdout: prompt + continuation)");
  sub->add_option("--model", opt.model, "Model: HDF5 file, llama2.c .bin, HF directory, or a training checkpoint (DIR/step-N, or DIR / DIR/latest for the newest usable one)")->required();
  sub->add_option("--tokenizer", opt.tokenizer, "SentencePiece .model (default: the one stored in the model or checkpoint)");
  sub->add_option("--lora", opt.lora,
                  "A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) for the model, "
                  "merged into the weights in memory");
  auto* prompt = sub->add_option("--prompt", opt.prompt, "Prompt text")->capture_default_str();
  const PromptCliHandles fmt = add_prompt_options(
      sub, opt.format, "", "Format --question/--context with prepare's layout 1|2|3 instead of --prompt");
  fmt.prompt_type->excludes(prompt);
  fmt.template_text->excludes(prompt);
  sub->add_option("--question", opt.question, "With --prompt-type or --template: the question");
  sub->add_option("--context", opt.context, "With --prompt-type or --template: the context (optional)");
  in_range(sub->add_option("--max-new-tokens", opt.max_new_tokens, "Tokens to generate at most")->capture_default_str(),
           ints_from(1));
  add_real(sub, "--temperature", opt.temperature, "Sampling temperature; 0 is greedy", reals_from(0))
      ->capture_default_str();
  add_real(sub, "--top-p", opt.top_p, "Nucleus sampling mass (1: off)", reals_in(0, 1, "(]"))->capture_default_str();
  in_range(sub->add_option("--seed", opt.seed, "Sampling seed (0: from the clock, printed on stderr)")
               ->capture_default_str(),
           ints_from<uint64_t>(0));
  add_precision_choice(sub, opt.precision,
                       "fp32 (the reference) or bf16: the weights rounded to bf16, as the bf16 CPU path's products "
                       "see them (decoding one token is a matrix-vector product, memory-bound: it stays on fp32 BLAS)");
  add_device_choice(sub, opt.device,
                    "Where the decoder runs: auto (a GPU when one is visible, else the CPU), cpu, cuda (bf16 "
                    "weights and key/value cache, fp32 logits), or cuda-sim (the CUDA backend with its kernels in "
                    "the CPU simulator; slow, for tests)");
  return sub;
}

namespace {

// The decoder's key and value caches, (n_layers, max_len, kv_dim) fp32 each.
void check_decoder_memory(const Llama2Config& cfg, int max_len) {
  const double cache = 2.0 * cfg.n_layers * max_len * cfg.kv_dim() * sizeof(float);
  check_memory_fits(cache, strcat("generate: the key/value cache of ", max_len, " positions"),
                    "use a smaller --max-new-tokens");
}

// --prompt, or --question and --context in the format of --prompt-type / --template; a formatted
// prompt without its trailing spaces (qa.h generation_prompt: training joins them to the answer's
// first piece, so the continuation writes them).
std::string generate_prompt_text(const GenerateOptions& opt) {
  const bool formatted = opt.format.given();
  if (formatted && opt.question.empty()) fail("generate: --prompt-type and --template need --question");
  if (!formatted && (!opt.question.empty() || !opt.context.empty()))
    fail("generate: --question and --context need --prompt-type or --template (the format they are written in)");
  std::string text =
      formatted ? generation_prompt(prompt_format_of(opt.format).prompt(opt.question, opt.context)) : opt.prompt;
  check_utf8(text, formatted ? "--question/--context" : "--prompt", "text must be UTF-8");
  return text;
}

}  // namespace

int run_generate(const GenerateOptions& opt) {
  const std::string prompt_str = generate_prompt_text(opt);
  LoadedModel loaded = load_model_and_tokenizer("generate", opt.model, opt.tokenizer);
  Llama2Model& model = loaded.model;
  if (!opt.lora.empty()) merge_lora_dir("generate", opt.lora, model.config(), model.params());
  if (opt.precision == Precision::kBf16)
    for (float& w : model.params()) w = cpu::bf16_to_float(cpu::float_to_bf16(w));
  const Tokenizer& tok = loaded.tokenizer;

  const std::vector<int32_t> prompt = tok.encode(prompt_str, true, false);
  const int model_len = model.config().max_seq_len;
  if (int(prompt.size()) >= model_len)
    fail(strcat("generate: the prompt is ", prompt.size(), " tokens, the model's max_seq_len is ", model_len));
  // The cache holds the positions this run can reach, not the model's whole context.
  const int max_len = int(std::min<int64_t>(model_len, int64_t(prompt.size()) + opt.max_new_tokens));
  const DeviceKind device = resolve_device(opt.device);
  if (device == DeviceKind::cpu) check_decoder_memory(model.config(), max_len);
  uint64_t seed = opt.seed;
  if (seed == 0 && opt.temperature > 0) {
    seed = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
    std::fprintf(stderr, "generate: seed %llu\n", (unsigned long long)seed);
  }
  const std::unique_ptr<Decoder> decoder = make_decoder(device, model, max_len, world().local_rank);
  if (device != DeviceKind::cpu) std::fprintf(stderr, "generate: device %s\n", device_name(device));
  Sampler sampler(opt.temperature, opt.top_p, seed);

  // Stdout: the prompt (formatted: as generation_prompt leaves it), then the continuation, streamed as soon as its decoded text
  // extends what was already printed (byte-fallback pieces may complete a character later).
  std::fputs(prompt_str.c_str(), stdout);
  std::fflush(stdout);
  std::vector<int32_t> ids = prompt;
  const std::string prompt_text = tok.decode(prompt);
  std::string printed;
  auto flush_new_text = [&](bool final) {
    std::string full = tok.decode(ids);
    std::string cont = full.compare(0, prompt_text.size(), prompt_text) == 0 ? full.substr(prompt_text.size())
                                                                             : full;
    if (cont.compare(0, printed.size(), printed) != 0) return;  // text rewritten; wait
    // Hold back a trailing U+FFFD (an incomplete UTF-8 sequence) until the next token.
    if (!final && cont.size() >= 3 && cont.compare(cont.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    std::fputs(cont.c_str() + printed.size(), stdout);
    std::fflush(stdout);
    printed = cont;
  };

  const auto t0 = std::chrono::steady_clock::now();
  int generated = 0;
  int32_t next = 0;
  for (int pos = 0; pos < max_len; ++pos) {
    const std::vector<float>& logits = decoder->step(ids[size_t(pos)], pos);
    if (pos + 1 < int(ids.size())) continue;  // still reading the prompt
    if (generated == opt.max_new_tokens) break;
    next = sampler.sample(logits);
    if (next == tok.eos_id() || next == tok.bos_id()) break;
    ids.push_back(next);
    ++generated;
    flush_new_text(false);
  }
  flush_new_text(true);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "generate: %d tokens, %.1f tok/s\n", generated, s > 0 ? (generated + prompt.size()) / s : 0.0);
  return 0;
}

}  // namespace lt::cli
