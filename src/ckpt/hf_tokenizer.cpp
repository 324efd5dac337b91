// tokenizer_config.json and special_tokens_map.json of an HF export (hf_model.h), written the way
// Meta's Llama-2-7b-hf has them, so that transformers' AutoTokenizer on the exported directory
// gives the ids llamatrain trained with.
#include <nlohmann/json.hpp>

#include "llamatrain/hf_model.h"
#include "llamatrain/tokenizer.h"

namespace lt {

HfTokenizerFiles hf_tokenizer_files(const std::string& sp_model, const std::string& origin, int model_max_length) {
  const Tokenizer tok = Tokenizer::from_serialized(sp_model, origin);
  // A special token is the piece the SentencePiece model gives its id (Llama's <s>, </s>, <unk>);
  // null where the model defines none (id -1), as transformers writes an unset token.
  auto token = [&](int id) { return id >= 0 ? nlohmann::json(tok.piece(id)) : nlohmann::json(nullptr); };
  nlohmann::ordered_json special;
  for (const auto& [name, id] : {std::pair<const char*, int>{"bos_token", tok.bos_id()}, {"eos_token", tok.eos_id()},
                                 {"unk_token", tok.unk_id()}, {"pad_token", tok.pad_id()}})
    if (id >= 0) special[name] = tok.piece(id);

  nlohmann::ordered_json config;
  config["tokenizer_class"] = "LlamaTokenizer";
  config["add_bos_token"] = tok.bos_id() >= 0;  // llamatrain starts every prompt and document with BOS
  config["add_eos_token"] = false;              // and ends none with EOS
  config["bos_token"] = token(tok.bos_id());
  config["eos_token"] = token(tok.eos_id());
  config["unk_token"] = token(tok.unk_id());
  config["pad_token"] = token(tok.pad_id());
  config["model_max_length"] = model_max_length;
  // legacy false: no extra space after a special token written in the text (transformers'
  // fixed behaviour, as Llama-2-7b-hf now sets it); plain text encodes the same either way.
  config["legacy"] = false;
  // Decoding gives SentencePiece's text back, without transformers' clean-up of " ." and " '".
  config["clean_up_tokenization_spaces"] = false;
  config["padding_side"] = "right";
  return {config.dump(2) + "\n", special.dump(2) + "\n"};
}

}  // namespace lt
