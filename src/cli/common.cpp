#include "cli/common.h"

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt::cli {

Tokenizer tokenizer_for(const std::string& tokenizer_path, const ModelData& model,
                        const std::string& model_path) {
  if (!tokenizer_path.empty()) {
    if (!file_exists(tokenizer_path)) fail(strcat(tokenizer_path, ": tokenizer file not found (--tokenizer)"));
    return Tokenizer::load(tokenizer_path);
  }
  if (model.tokenizer_model.empty())
    fail(strcat(model_path, ": the model file carries no tokenizer; pass --tokenizer TOK.model"));
  return Tokenizer::from_serialized(model.tokenizer_model, model_path + ":/tokenizer/model");
}

void check_tokenizer_fits(const Tokenizer& tok, const std::string& tokenizer_origin,
                          const Llama2Config& cfg, const std::string& model_path) {
  if (tok.vocab_size() > cfg.vocab_size)
    fail(strcat(tokenizer_origin, ": tokenizer has ", tok.vocab_size(), " pieces but ", model_path,
                " has vocab_size ", cfg.vocab_size, " (wrong tokenizer for this model?)"));
}

LoadedModel load_model_and_tokenizer(const std::string& model_path, const std::string& tokenizer_path) {
  ModelData md = load_model(model_path);
  Tokenizer tok = tokenizer_for(tokenizer_path, md, model_path);
  check_tokenizer_fits(tok, tokenizer_path.empty() ? model_path : tokenizer_path, md.config, model_path);
  LoadedModel m{Llama2Model(md.config), std::move(tok)};
  m.model.params() = std::move(md.params);
  return m;
}

}  // namespace lt::cli
