// SentencePiece behind lt::Tokenizer. The serialized model proto is kept byte for byte as read,
// so the sha256 recorded in datasets matches `sha256sum tokenizer.model`.
#include "llamatrain/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string serialized;
  std::string origin;

  void check_id(int32_t id) const {
    if (id < 0 || id >= sp.GetPieceSize())
      fail(strcat(origin, ": token id ", id, " is outside the vocabulary [0, ", sp.GetPieceSize(),
                  ")"));
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  if (!file_exists(path)) fail(strcat(path, ": tokenizer model not found"));
  refuse_special_file(path, "tokenizer model");
  return from_serialized(read_file_bytes(path), path);
}

Tokenizer Tokenizer::from_serialized(const std::string& bytes, const std::string& origin) {
  // An empty buffer parses as an empty proto, so it is rejected before SentencePiece sees it.
  if (bytes.empty()) fail(strcat(origin, ": not a SentencePiece model (empty)"));
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  auto status = impl->sp.LoadFromSerializedProto(bytes);
  if (!status.ok())
    fail(strcat(origin, ": not a SentencePiece model (", status.ToString(), ")"));
  if (impl->sp.GetPieceSize() <= 0)
    fail(strcat(origin, ": not a SentencePiece model (no pieces)"));
  impl->serialized = bytes;
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode_with_ends(const std::string& text, std::vector<uint32_t>* ends) const {
  sentencepiece::ImmutableSentencePieceText spt;
  auto status = impl_->sp.Encode(text, spt.mutable_proto());
  if (!status.ok()) fail(strcat(impl_->origin, ": encode failed (", status.ToString(), ")"));
  std::vector<int32_t> ids;
  ids.reserve(size_t(spt.pieces_size()));
  ends->clear();
  for (const auto& piece : spt.pieces()) {
    ids.push_back(int32_t(piece.id()));
    ends->push_back(uint32_t(piece.end()));
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool bos, bool eos) const {
  std::vector<int> ids;
  auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) fail(strcat(impl_->origin, ": encode failed (", status.ToString(), ")"));
  std::vector<int32_t> out;
  out.reserve(ids.size() + 2);
  if (bos) {
    if (bos_id() < 0) fail(strcat(impl_->origin, ": the model defines no BOS token"));
    out.push_back(bos_id());
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (eos) {
    if (eos_id() < 0) fail(strcat(impl_->origin, ": the model defines no EOS token"));
    out.push_back(eos_id());
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (id != bos_id() && id != eos_id()) kept.push_back(id);
  }
  std::string text;
  auto status = impl_->sp.Decode(kept, &text);
  if (!status.ok()) fail(strcat(impl_->origin, ": decode failed (", status.ToString(), ")"));
  return text;
}

std::string Tokenizer::piece(int32_t id) const {
  impl_->check_id(id);
  return impl_->sp.IdToPiece(id);
}

int Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int Tokenizer::bos_id() const { return impl_->sp.bos_id(); }
int Tokenizer::eos_id() const { return impl_->sp.eos_id(); }
int Tokenizer::unk_id() const { return impl_->sp.unk_id(); }
int Tokenizer::pad_id() const { return impl_->sp.pad_id(); }
const std::string& Tokenizer::serialized() const { return impl_->serialized; }
std::string Tokenizer::sha256() const { return sha256_hex(impl_->serialized); }

std::string train_tokenizer(const TokenizerTrainOptions& opt) {
  if (!file_exists(opt.input_path)) fail(strcat(opt.input_path, ": training text not found"));
  refuse_special_file(opt.input_path, "training text");
  if (opt.model_prefix.empty()) fail("train_tokenizer: model_prefix is empty");
  if (opt.model_type != "bpe" && opt.model_type != "unigram")
    fail(strcat("tokenizer type '", opt.model_type, "' is not supported (bpe or unigram)"));
  std::string symbols;
  for (const auto& s : opt.user_defined_symbols) {
    // SentencePiece takes the list comma-separated, so a comma inside a symbol would split it.
    if (s.empty() || s.find(',') != std::string::npos)
      fail(strcat("user-defined symbol '", s, "' is empty or contains a comma"));
    symbols += (symbols.empty() ? "" : ",") + s;
  }
  // The settings Meta used for Llama 2 (and llama2.c's train_vocab.py): every byte representable
  // (byte fallback, full character coverage), digits as single tokens, whitespace kept verbatim
  // so decode(encode(x)) == x. The Debian build (0.1.97) has no `random_seed` trainer field, so
  // sentence sampling is seeded through the library-wide SetRandomGeneratorSeed instead.
  std::unordered_map<std::string, std::string> args = {
      {"input", opt.input_path},
      {"model_type", opt.model_type},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"character_coverage", "1.0"},
      // At most 1M lines are sampled (shuffled) from large corpora: training memory and time
      // grow with the sample, and 1M lines already give stable piece statistics.
      {"input_sentence_size", "1000000"},
      {"shuffle_input_sentence", "true"},
      // Plain text often has one paragraph per line; the default 4192-byte cap would silently
      // drop long paragraphs from training.
      {"max_sentence_length", "16384"},
      {"num_threads", "2"},
      {"minloglevel", "2"},
  };
  if (!symbols.empty()) args["user_defined_symbols"] = symbols;
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(opt.seed ^ (opt.seed >> 32)));

  // Trained into memory, then published atomically, so an interrupted run never leaves a
  // truncated .model that a later run would pick up.
  std::string proto;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, nullptr, &proto);
  if (!status.ok())
    fail(strcat(opt.input_path, ": tokenizer training failed (", status.ToString(), ")"));
  const std::string model_path = opt.model_prefix + ".model";
  sentencepiece::SentencePieceProcessor sp;
  status = sp.LoadFromSerializedProto(proto);
  if (!status.ok())
    fail(strcat(model_path, ": trained model does not load (", status.ToString(), ")"));
  write_file_atomic(model_path, proto);
  // The .vocab companion (piece TAB score, as spm_train writes it) is for people reading it.
  std::string vocab;
  for (int id = 0; id < sp.GetPieceSize(); ++id)
    vocab += strcat(sp.IdToPiece(id), "\t", sp.GetScore(id), "\n");
  write_file_atomic(opt.model_prefix + ".vocab", vocab);
  return model_path;
}

}  // namespace lt
