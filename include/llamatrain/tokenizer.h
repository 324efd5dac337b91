// SentencePiece tokenizer with Llama 2's conventions (BOS=1, EOS=2 for Llama's models, taken
// from the model proto in general; encode prepends BOS when asked, never a pad).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lt {

class Tokenizer {
 public:
  // Loads a SentencePiece .model file; throws "<path>: ..." when missing or not a model.
  static Tokenizer load(const std::string& path);
  // From the serialized model proto (as stored in datasets); `origin` names it in errors.
  static Tokenizer from_serialized(const std::string& bytes, const std::string& origin);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(const std::string& text, bool bos, bool eos) const;
  // encode(text, false, false) plus, for each token, the byte offset in `text` where its piece
  // ends, so a caller can tell which tokens cover which part of a concatenated text.
  std::vector<int32_t> encode_with_ends(const std::string& text, std::vector<uint32_t>* ends) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // BOS/EOS dropped
  std::string piece(int32_t id) const;
  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;
  int unk_id() const;
  int pad_id() const;  // -1 when the model defines none (Llama's do not)
  const std::string& serialized() const;  // the model proto bytes
  std::string sha256() const;             // of serialized()

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct TokenizerTrainOptions {
  std::string input_path;        // plain text, one sentence per line as SentencePiece reads it
  std::string model_prefix;      // writes <prefix>.model and <prefix>.vocab
  int vocab_size = 512;
  std::string model_type = "bpe";  // bpe | unigram
  uint64_t seed = 1234;
  std::vector<std::string> user_defined_symbols;  // single pieces (prompt markers, issue 3)
};
// Trains with the SentencePiece library API, Llama 2 settings: byte fallback, digits split,
// unk=0 bos=1 eos=2 no pad, identity normalisation. Returns the path of the .model file.
std::string train_tokenizer(const TokenizerTrainOptions& opt);

}  // namespace lt
