#include <cstdio>

#include "cli/commands.h"
#include "llamatrain/error.h"
#include "llamatrain/model_io.h"
#include "llamatrain/tokenizer.h"

namespace lt::cli {

CLI::App* setup_convert(CLI::App& root, ConvertOptions& opt) {
  CLI::App* sub = root.add_subcommand(
      "convert", "Convert a model between llama2.c v0 .bin and the llamatrain HDF5 model file");
  sub->add_option("--input", opt.input, "Model file; its format is recognised by content")->required();
  sub->add_option("--output", opt.output, "Output file (.bin: llama2.c, .h5/.hdf5: HDF5)")->required();
  sub->add_option("--to", opt.to, "Output format, overriding the extension")->check(CLI::IsMember({"hdf5", "llama2c"}));
  sub->add_option("--tokenizer", opt.tokenizer, "SentencePiece .model to store inside an HDF5 output");
  return sub;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

int run_convert(const ConvertOptions& opt) {
  std::string to = opt.to;
  if (to.empty()) {
    if (ends_with(opt.output, ".bin")) to = "llama2c";
    else if (ends_with(opt.output, ".h5") || ends_with(opt.output, ".hdf5")) to = "hdf5";
    else fail(strcat("convert: cannot tell the output format from '", opt.output, "'; use --to hdf5|llama2c"));
  }
  const ModelFormat in_format = detect_model_format(opt.input);
  ModelData m = load_model(opt.input);
  if (!opt.tokenizer.empty()) {
    const Tokenizer tok = Tokenizer::load(opt.tokenizer);
    if (tok.vocab_size() > m.config.vocab_size)
      fail(strcat(opt.tokenizer, ": tokenizer has ", tok.vocab_size(), " pieces, the model's vocab_size is ",
                  m.config.vocab_size));
    m.tokenizer_model = tok.serialized();
  }
  if (to == "hdf5") save_model_hdf5(opt.output, m);
  else save_model_llama2c(opt.output, m);
  std::fprintf(stderr, "convert: %s (%s) -> %s (%s), %s\n", opt.input.c_str(), model_format_name(in_format),
               opt.output.c_str(), to.c_str(), m.config.to_string().c_str());
  return 0;
}

}  // namespace lt::cli
