// lt::Tokenizer against the real Llama 2 tokenizer (reference ids from llama-tokenizer-js) and
// llama2.c's tok512, plus training a small tokenizer with the library API.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using lt::testing::error_of;
using lt::testing::scratch_dir;

const std::string kShared = lt::testing::kSharedData;



// A corpus over a small alphabet (so 300 pieces cover every character plus 256 bytes and 3
// specials) with enough repetition for BPE merges; deterministic.
std::string small_corpus() {
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "at", "the", "hat", "1234"};
  std::string text;
  uint32_t x = 7;
  for (int line = 0; line < 3000; ++line) {
    x = x * 1664525u + 1013904223u;
    const int n = 3 + static_cast<int>((x >> 16) % 10);
    for (int w = 0; w < n; ++w) {
      x = x * 1664525u + 1013904223u;
      text += (w ? " " : "") + std::string(words[(x >> 16) % 10]);
    }
    text += ".\n";
  }
  return text;
}

}  // namespace

TEST(Tokenizer, Llama2ReferenceCases) {
  const std::string model = kShared + "/llama2-tokenizer.model";
  const std::string cases = kShared + "/llama2_tokenizer_cases.json";
  if (!lt::file_exists(model) || !lt::file_exists(cases))
    GTEST_SKIP() << kShared << "/llama2-tokenizer.model or llama2_tokenizer_cases.json absent";
  const auto tok = lt::Tokenizer::load(model);
  EXPECT_EQ(tok.vocab_size(), 32000);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.piece(1), "<s>");
  EXPECT_EQ(tok.piece(13), "<0x0A>");
  const auto json = nlohmann::json::parse(lt::read_file_bytes(cases));
  ASSERT_EQ(json.size(), 12u);
  for (const auto& c : json) {
    const std::string input = c.at("input");
    const auto expected = c.at("expected_ids").get<std::vector<int32_t>>();
    const auto ids = tok.encode(input, true, false);
    EXPECT_EQ(ids, expected) << "input: " << input;
    EXPECT_EQ(tok.decode(ids), input);
  }
  EXPECT_EQ(tok.sha256(), lt::sha256_file(model));
  EXPECT_EQ(tok.serialized(), lt::read_file_bytes(model));
}

TEST(Tokenizer, Tok512OnceUponATime) {
  const std::string model = kShared + "/tok512.model";
  if (!lt::file_exists(model)) GTEST_SKIP() << model << " absent";
  const auto tok = lt::Tokenizer::load(model);
  EXPECT_EQ(tok.vocab_size(), 512);
  const auto ids = tok.encode("Once upon a time", true, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.encode("Once upon a time", true, true).back(), 2);
  EXPECT_EQ(tok.decode(ids), "Once upon a time");
  // BOS and EOS are dropped by decode wherever they are.
  EXPECT_EQ(tok.decode({1, 403, 407, 2, 261, 378, 2}), "Once upon a time");
  const std::string story = "One day, Lily found a needle in her room.\nShe smiled!";
  EXPECT_EQ(tok.decode(tok.encode(story, true, true)), story);
  // From the serialized proto (as stored in datasets) it behaves the same.
  const auto copy = lt::Tokenizer::from_serialized(tok.serialized(), "data.h5:/tokenizer/model");
  EXPECT_EQ(copy.encode(story, true, false), tok.encode(story, true, false));
  EXPECT_EQ(copy.sha256(), tok.sha256());
  EXPECT_EQ(error_of([&] { tok.piece(512); }), model + ": token id 512 is outside the vocabulary [0, 512)");
  EXPECT_EQ(error_of([&] { tok.decode({5, -1}); }), model + ": token id -1 is outside the vocabulary [0, 512)");
}

TEST(Tokenizer, RejectsFilesThatAreNotModels) {
  const fs::path dir = scratch_dir();
  const std::string text = (dir / "not_a_model.model").string();
  lt::write_file_atomic(text, "this is a text file\nwith two lines\n");
  const std::string msg = error_of([&] { lt::Tokenizer::load(text); });
  EXPECT_EQ(msg.rfind(text + ": not a SentencePiece model", 0), 0u) << msg;
  const std::string empty = (dir / "empty.model").string();
  lt::write_file_atomic(empty, "");
  EXPECT_EQ(error_of([&] { lt::Tokenizer::load(empty); }), empty + ": not a SentencePiece model (empty)");
  const std::string missing = (dir / "missing.model").string();
  EXPECT_EQ(error_of([&] { lt::Tokenizer::load(missing); }), missing + ": tokenizer model not found");
  fs::remove_all(dir);
}

TEST(Tokenizer, TrainSmallBpeWithByteFallback) {
  const fs::path dir = scratch_dir();
  const std::string corpus = (dir / "corpus.txt").string();
  lt::write_file_atomic(corpus, small_corpus());
  lt::TokenizerTrainOptions opt;
  opt.input_path = corpus;
  opt.model_prefix = (dir / "tok").string();
  opt.vocab_size = 300;
  opt.user_defined_symbols = {"<|user|>"};
  const std::string path = lt::train_tokenizer(opt);
  EXPECT_EQ(path, opt.model_prefix + ".model");
  EXPECT_TRUE(lt::file_exists(opt.model_prefix + ".vocab"));
  const auto tok = lt::Tokenizer::load(path);
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.piece(0), "<unk>");
  EXPECT_EQ(tok.piece(3), "<|user|>");
  EXPECT_EQ(tok.piece(4), "<0x00>");  // 256 byte pieces follow the specials
  EXPECT_EQ(tok.piece(4 + 0xF0), "<0xF0>");
  // A frequent word is one piece; digits are split one per token (split_digits).
  const auto the = tok.encode("the cat", false, false);
  EXPECT_EQ(the.size(), 2u);
  EXPECT_EQ(tok.piece(the[0]), "\xE2\x96\x81the");
  const auto digits = tok.encode("1234", false, false);
  ASSERT_EQ(digits.size(), 5u);  // "▁" + one token per digit
  EXPECT_EQ(tok.piece(digits[1]), "1");
  EXPECT_EQ(tok.piece(digits[4]), "4");
  // Unseen characters go through byte fallback and round-trip: é is 2 bytes, 🦙 is 4.
  const std::string unseen = "the \xC3\xA9 \xF0\x9F\xA6\x99 cat";
  const auto ids = tok.encode(unseen, true, false);
  EXPECT_EQ(tok.decode(ids), unseen);
  int byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += tok.piece(id).rfind("<0x", 0) == 0;
  EXPECT_EQ(byte_tokens, 6);
  // Whitespace and newlines are kept verbatim (identity normalisation, no whitespace removal).
  const std::string spaced = "  the\n\n  cat  ";
  EXPECT_EQ(tok.decode(tok.encode(spaced, false, false)), spaced);
  // The user-defined symbol is a single token.
  const auto marker = tok.encode("<|user|> the", false, false);
  EXPECT_NE(std::find(marker.begin(), marker.end(), 3), marker.end());

  // Same seed, same model.
  opt.model_prefix = (dir / "tok2").string();
  const auto again = lt::Tokenizer::load(lt::train_tokenizer(opt));
  EXPECT_EQ(again.sha256(), tok.sha256());
  fs::remove_all(dir);
}

TEST(Tokenizer, TrainUnigramAndTrainingErrors) {
  const fs::path dir = scratch_dir();
  const std::string corpus = (dir / "corpus.txt").string();
  lt::write_file_atomic(corpus, small_corpus());
  lt::TokenizerTrainOptions opt;
  opt.input_path = corpus;
  opt.model_prefix = (dir / "uni").string();
  opt.vocab_size = 280;
  opt.model_type = "unigram";
  const auto tok = lt::Tokenizer::load(lt::train_tokenizer(opt));
  EXPECT_EQ(tok.vocab_size(), 280);
  const std::string s = "the cat sat on the mat at 12 noon.";
  EXPECT_EQ(tok.decode(tok.encode(s, true, true)), s);

  opt.model_type = "word";
  EXPECT_EQ(error_of([&] { lt::train_tokenizer(opt); }),
            "tokenizer type 'word' is not supported (bpe or unigram)");
  opt.model_type = "bpe";
  opt.vocab_size = 100000;  // far more pieces than the corpus can give
  const std::string too_big = error_of([&] { lt::train_tokenizer(opt); });
  EXPECT_EQ(too_big.rfind(corpus + ": tokenizer training failed (", 0), 0u) << too_big;
  opt.input_path = (dir / "missing.txt").string();
  EXPECT_EQ(error_of([&] { lt::train_tokenizer(opt); }), opt.input_path + ": training text not found");
  fs::remove_all(dir);
}
