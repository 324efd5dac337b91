// llamatrain's own token ids for tests/hf/test_hf_tokenizer.py: each text of a JSON array encoded as
// `generate` encodes a prompt and `prepare` a document (Tokenizer::encode(text, true, false): BOS
// first, no EOS), with the tokenizer a model file carries (any format load_model reads) or a
// SentencePiece .model. Prints one JSON array of id arrays on stdout.
// Usage: lt_tokenize_ids MODEL|TOKENIZER.model TEXTS.json
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/model_io.h"
#include "llamatrain/tokenizer.h"

namespace {

lt::Tokenizer tokenizer_of(const std::string& path) {
  if (path.size() > 6 && path.compare(path.size() - 6, 6, ".model") == 0) return lt::Tokenizer::load(path);
  const lt::ModelData m = lt::load_model(path);
  if (m.tokenizer_model.empty()) lt::fail(lt::strcat(path, ": the model carries no tokenizer"));
  return lt::Tokenizer::from_serialized(m.tokenizer_model, path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL|TOKENIZER.model TEXTS.json\n", argv[0]);
    return 2;
  }
  try {
    const lt::Tokenizer tok = tokenizer_of(argv[1]);
    const nlohmann::json texts = nlohmann::json::parse(lt::read_file_bytes(argv[2]));
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : texts) out.push_back(tok.encode(t.get<std::string>(), true, false));
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lt_tokenize_ids: %s\n", e.what());
    return 1;
  }
  return 0;
}
