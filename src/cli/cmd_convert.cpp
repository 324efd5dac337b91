#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranges.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/hf_model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/tokenizer.h"

namespace lt::cli {

CLI::App* setup_convert(CLI::App& root, ConvertOptions& opt) {
  CLI::App* sub = root.add_subcommand(
      "convert",
      "Convert a model between the Hugging Face layout (config.json + safetensors), llama2.c v0 .bin "
      "and the llamatrain HDF5 model file");
  sub->add_option("--input", opt.input, "Model file, HF directory or training checkpoint (DIR/step-N, or DIR / DIR/latest for the newest usable one); its format is recognised by content")->required();
  sub->add_option("--output", opt.output,
                  "Output: a directory, a name without extension or X.safetensors: HF; .bin: llama2.c; "
                  ".h5/.hdf5: HDF5")
      ->required();
  sub->add_option("--merge-lora", opt.merge_lora,
                  "A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) to merge into "
                  "the weights written (W + alpha/r B A)");
  sub->add_option("--to", opt.to, "Output format, overriding the output path")
      ->check(CLI::IsMember({"hdf5", "hf", "llama2c"}));
  sub->add_option("--dtype", opt.dtype, "Tensor type of an HF output (bf16 rounds to nearest even)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  in_range(sub->add_option("--max-shard-size", opt.max_shard_size,
                           "HF output: above this many bytes of tensors, write model-0000i-of-0000N.safetensors shards "
                           "and model.safetensors.index.json (e.g. 5GB, 500MB; GB = 10^9, GiB = 2^30)")
               ->transform(CLI::AsSizeValue(true))
               ->default_str("5GB"),
           ints_from<uint64_t>(1));
  sub->add_flag("--overwrite", opt.overwrite,
                "HF output: replace an existing config.json (and the weights beside it) that llamatrain did not "
                "write for this model; without it such an export is refused");
  sub->add_option("--tokenizer", opt.tokenizer,
                  "SentencePiece .model to store with an HDF5 output (inside) or an HF output (tokenizer.model, with "
                  "tokenizer_config.json and special_tokens_map.json for transformers' AutoTokenizer); default: the "
                  "one the input carries");
  return sub;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The output format from the output path: an HF model is a directory, so an existing directory,
// a trailing '/' or a name without an extension means HF, as does a single .safetensors file.
std::string format_from_output(const std::string& out) {
  if (std::filesystem::is_directory(out) || ends_with(out, "/") || ends_with(out, ".safetensors")) return "hf";
  if (ends_with(out, ".bin")) return "llama2c";
  if (ends_with(out, ".h5") || ends_with(out, ".hdf5")) return "hdf5";
  if (!std::filesystem::path(out).has_extension()) return "hf";
  fail(strcat("convert: cannot tell the output format from '", out,
              "' (a directory or .safetensors: HF, .bin: llama2.c, .h5/.hdf5: HDF5); use --to hdf5|hf|llama2c"));
}

// No garbage out: the tokenizer written beside the model (--tokenizer, or the one the input
// carries) must load with the SentencePiece loader and fit the model's vocabulary; checked
// before anything is written.
void check_tokenizer_to_copy(const ModelData& m, const ConvertOptions& opt) {
  if (m.tokenizer_model.empty()) return;
  const std::string origin = !opt.tokenizer.empty()                     ? opt.tokenizer
                             : m.format == ModelFormat::kHf             ? m.source + "/tokenizer.model"
                             : m.format == ModelFormat::kCheckpoint     ? m.source + "/checkpoint.h5:/tokenizer/model"
                                                                        : m.source + ":/tokenizer/model";
  Tokenizer tok = [&] {
    try {
      return Tokenizer::from_serialized(m.tokenizer_model, origin);
    } catch (const Error& e) {
      fail(strcat(e.what(), "; convert copies only a tokenizer that loads (pass a good one with --tokenizer)"));
    }
  }();
  if (tok.vocab_size() > m.config.vocab_size)
    fail(strcat(origin, ": tokenizer has ", tok.vocab_size(), " pieces, the model's vocab_size is ", m.config.vocab_size));
}

}  // namespace

int run_convert(const ConvertOptions& opt) {
  const std::string to = opt.to.empty() ? format_from_output(opt.output) : opt.to;
  // llama2.c v0 and our HDF5 model file hold fp32 only; refusing beats silently ignoring.
  if (opt.dtype != "fp32" && to != "hf")
    fail(strcat("convert: --dtype ", opt.dtype, " applies to HF output only; ", to, " stores fp32"));
  // Where the output file or HF directory will be made, and that it is no input: fail now, not
  // after loading the model.
  refuse_output_over_input({{"--output", opt.output}},
                           {{"--input", opt.input}, {"--tokenizer", opt.tokenizer}, {"--merge-lora", opt.merge_lora}});
  check_writable_dir(std::filesystem::path(opt.output).parent_path().string(), "--output");
  ModelData m = load_model_noting("convert", opt.input);
  if (!opt.merge_lora.empty()) merge_lora_dir("convert", opt.merge_lora, m.config, m.params);
  const ModelFormat in_format = m.format;
  if (!opt.tokenizer.empty()) m.tokenizer_model = Tokenizer::load(opt.tokenizer).serialized();
  check_tokenizer_to_copy(m, opt);
  if (to == "hdf5") {
    save_model_hdf5(opt.output, m);
  } else if (to == "hf") {
    if (m.tokenizer_model.empty())
      std::fprintf(stderr,
                   "convert: note: %s carries no tokenizer and no --tokenizer was given, so %s gets no %s, %s or "
                   "%s and transformers' AutoTokenizer cannot load it; pass --tokenizer FILE.model, the one the "
                   "model was trained with\n",
                   opt.input.c_str(), opt.output.c_str(), kHfTokenizerFile, kHfTokenizerConfigFile,
                   kHfSpecialTokensFile);
    HfExportOptions hf;
    hf.bf16 = opt.dtype == "bf16";
    hf.max_shard_bytes = opt.max_shard_size;
    hf.overwrite = opt.overwrite;
    save_model_hf(opt.output, m, hf);
  } else {
    // The v0 header has no fields for these; run.c (and our reader) assume Llama 2's values.
    const Llama2Config defaults;
    if (m.config.norm_eps != defaults.norm_eps || m.config.rope_theta != defaults.rope_theta)
      std::fprintf(stderr,
                   "convert: warning: llama2.c v0 cannot record norm_eps=%g rope_theta=%g; readers of %s will "
                   "assume %g and %g\n",
                   double(m.config.norm_eps), double(m.config.rope_theta), opt.output.c_str(),
                   double(defaults.norm_eps), double(defaults.rope_theta));
    save_model_llama2c(opt.output, m);
  }
  std::fprintf(stderr, "convert: %s (%s) -> %s (%s%s), %s\n", opt.input.c_str(), model_format_name(in_format),
               opt.output.c_str(), to.c_str(), to == "hf" ? (opt.dtype == "bf16" ? ", bf16" : ", fp32") : "",
               m.config.to_string().c_str());
  return 0;
}

}  // namespace lt::cli
