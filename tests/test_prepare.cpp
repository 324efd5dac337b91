// `llamatrain prepare --text`: row packing, the seeded split, chunked encoding (must equal one
// encode call), the whole pipeline end to end, its errors, the CLI wiring, and lt::Progress.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>

#include "cli/commands.h"
#include "llamatrain/builtin_corpus.h"
#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/prepare.h"
#include "llamatrain/progress.h"
#include "llamatrain/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using lt::testing::error_of;
using lt::testing::scratch_dir;

const std::string kShared = lt::testing::kSharedData;



// Deterministic text over a small alphabet (a 300-piece tokenizer covers it), with blank lines,
// indented lines and a final line without newline: the shapes that matter for chunking.
std::string story_text(int lines) {
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "at", "the", "hat", "42"};
  std::string text;
  uint32_t x = 99;
  for (int line = 0; line < lines; ++line) {
    x = x * 1664525u + 1013904223u;
    if (line % 9 == 4) text += "  ";
    const int n = 2 + static_cast<int>((x >> 16) % 12);
    for (int w = 0; w < n; ++w) {
      x = x * 1664525u + 1013904223u;
      text += (w ? " " : "") + std::string(words[(x >> 16) % 10]);
    }
    text += line % 5 == 2 ? ".\n\n" : ".\n";
  }
  return text + "the end";
}

lt::PrepareTextOptions base_options(const fs::path& dir, const std::string& text) {
  const std::string text_path = (dir / "corpus.txt").string();
  lt::write_file_atomic(text_path, text);
  lt::PrepareTextOptions opt;
  opt.text_path = text_path;
  opt.output_path = (dir / "data.h5").string();
  opt.seq_len = 32;
  opt.vocab_size = 300;
  opt.test_split = 0.2;
  opt.seed = 7;
  opt.quiet = true;
  return opt;
}

std::vector<int32_t> row(const lt::TokenSplit& s, int64_t i) {
  return {s.row_tokens(i), s.row_tokens(i) + s.seq_len + 1};
}

}  // namespace

TEST(PackRows, CountOverlapAndMask) {
  struct Case {
    int n_tok, seq_len;
    int64_t rows;
  };
  // n_seq = ceil((N-1)/L) for N >= 2.
  for (const Case c : {Case{0, 4, 0}, Case{1, 4, 0}, Case{2, 1, 1}, Case{2, 4, 1}, Case{5, 4, 1},
                       Case{6, 4, 2}, Case{10, 3, 3}, Case{11, 3, 4}, Case{1001, 10, 100},
                       Case{1002, 10, 101}}) {
    std::vector<int32_t> stream(c.n_tok);
    for (int i = 0; i < c.n_tok; ++i) stream[i] = 100 + i;
    const auto s = lt::pack_rows(stream, c.seq_len);
    ASSERT_EQ(s.n_seq, c.rows) << c.n_tok << " tokens, L=" << c.seq_len;
    ASSERT_EQ(s.tokens.size(), static_cast<size_t>(c.rows * (c.seq_len + 1)));
    // Row i starts at stream[i*L]; consecutive rows share one token.
    for (int64_t i = 0; i + 1 < s.n_seq; ++i) {
      EXPECT_EQ(s.row_tokens(i)[0], 100 + i * c.seq_len);
      EXPECT_EQ(s.row_tokens(i)[c.seq_len], s.row_tokens(i + 1)[0]);
    }
    // Every token after the first is a masked-in target exactly once, in order.
    std::vector<int32_t> targets;
    for (int64_t i = 0; i < s.n_seq; ++i) {
      EXPECT_EQ(s.row_mask(i)[0], 0);
      for (int j = 1; j <= c.seq_len; ++j)
        if (s.row_mask(i)[j]) targets.push_back(s.row_tokens(i)[j]);
    }
    std::vector<int32_t> expect(stream.begin() + std::min(c.n_tok, 1), stream.end());
    EXPECT_EQ(targets, expect);
    EXPECT_EQ(s.loss_tokens(), std::max(0, c.n_tok - 1));
  }
  // The padded last row: 11 tokens, L=3 -> row 3 is [109, 110, 0, 0] with mask [0, 1, 0, 0].
  std::vector<int32_t> stream(11);
  for (int i = 0; i < 11; ++i) stream[i] = 100 + i;
  const auto s = lt::pack_rows(stream, 3);
  EXPECT_EQ(row(s, 3), (std::vector<int32_t>{109, 110, 0, 0}));
  EXPECT_EQ(std::vector<uint8_t>(s.row_mask(3), s.row_mask(3) + 4), (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(std::vector<uint8_t>(s.row_mask(0), s.row_mask(0) + 4), (std::vector<uint8_t>{0, 1, 1, 1}));
}

TEST(SplitRows, SeededAndComplete) {
  // Pinned against an independent Python implementation of splitmix64 + Fisher-Yates with
  // Lemire's multiply-shift bound (lt::Rng::below), so a change of RNG or shuffle (which would
  // silently change every dataset's split) fails here.
  EXPECT_EQ(lt::split_rows(20, 0.25, 2024).test, (std::vector<int64_t>{3, 11, 14, 15, 17}));
  const auto big = lt::split_rows(1000, 0.1, 1234);
  ASSERT_EQ(big.test.size(), 100u);
  EXPECT_EQ(std::vector<int64_t>(big.test.begin(), big.test.begin() + 12),
            (std::vector<int64_t>{0, 2, 11, 23, 40, 54, 66, 70, 79, 86, 87, 99}));

  const auto a = lt::split_rows(500, 0.2, 7), b = lt::split_rows(500, 0.2, 7), c = lt::split_rows(500, 0.2, 8);
  EXPECT_EQ(a.test, b.test);
  EXPECT_EQ(a.train, b.train);
  EXPECT_NE(a.test, c.test);
  EXPECT_EQ(a.test.size(), 100u);
  EXPECT_EQ(a.train.size(), 400u);
  EXPECT_TRUE(std::is_sorted(a.train.begin(), a.train.end()));
  EXPECT_TRUE(std::is_sorted(a.test.begin(), a.test.end()));
  std::vector<int64_t> all = a.train;
  all.insert(all.end(), a.test.begin(), a.test.end());
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 500; ++i) ASSERT_EQ(all[i], i);  // disjoint and complete

  EXPECT_EQ(lt::split_rows(50, 0.0, 1).test.size(), 0u);
  EXPECT_EQ(lt::split_rows(1, 0.5, 1).test.size(), 0u);    // the only row stays in train
  EXPECT_EQ(lt::split_rows(2, 0.01, 1).test.size(), 1u);   // at least one when F > 0
  EXPECT_EQ(lt::split_rows(10, 0.99, 1).test.size(), 9u);  // at least one train row
  EXPECT_EQ(lt::split_rows(0, 0.5, 1).train.size(), 0u);
}

TEST(EncodeStream, ChunkedEqualsOneCall) {
  const fs::path dir = scratch_dir();
  const std::string text = story_text(12000);  // ~400 KB: several 64 KiB chunks
  ASSERT_GT(text.size(), 4u * 65536);
  const std::string corpus = (dir / "corpus.txt").string();
  lt::write_file_atomic(corpus, text);
  lt::TokenizerTrainOptions t;
  t.input_path = corpus;
  t.model_prefix = (dir / "tok").string();
  t.vocab_size = 300;
  const auto tok = lt::Tokenizer::load(lt::train_tokenizer(t));
  bool chunked = false;
  const auto stream = lt::encode_text_stream(tok, text, nullptr, &chunked);
  EXPECT_TRUE(chunked);
  EXPECT_EQ(stream, tok.encode(text, true, false));
  EXPECT_EQ(stream[0], 1);
  EXPECT_EQ(tok.decode(stream), text);
  // Short text (one chunk), CRLF line ends, text starting with newlines.
  for (const std::string& s : {std::string("the cat"), std::string("\n\n  the cat\r\nsat\r\n"),
                              std::string(70000, 'a') + "\n the hat\n"})
    EXPECT_EQ(lt::encode_text_stream(tok, s), tok.encode(s, true, false));

  // A tokenizer with a piece that contains a newline cannot be chunked; the result must still
  // be the one-call encoding.
  t.model_prefix = (dir / "nl").string();
  t.user_defined_symbols = {".\n\n"};
  const auto nl_tok = lt::Tokenizer::load(lt::train_tokenizer(t));
  EXPECT_EQ(lt::encode_text_stream(nl_tok, text, nullptr, &chunked), nl_tok.encode(text, true, false));
  EXPECT_FALSE(chunked);
  fs::remove_all(dir);
}

TEST(EncodeStream, RealTokenizersOnRealText) {
  const std::string llama = kShared + "/llama2-tokenizer.model", tok512 = kShared + "/tok512.model";
  const std::string shakespeare = kShared + "/tinyshakespeare.txt", stories = kShared + "/tinystories_sample.txt";
  for (const auto& f : {llama, tok512, shakespeare, stories})
    if (!lt::file_exists(f)) GTEST_SKIP() << f << " absent";
  const auto llama_tok = lt::Tokenizer::load(llama);
  const auto small_tok = lt::Tokenizer::load(tok512);
  const std::string play = lt::read_file_bytes(shakespeare).substr(0, 300000);
  const std::string story = lt::read_file_bytes(stories);
  for (const auto& [tok, text] : {std::pair{&llama_tok, &play}, std::pair{&llama_tok, &story},
                                   std::pair{&small_tok, &story}}) {
    bool chunked = false;
    EXPECT_EQ(lt::encode_text_stream(*tok, *text, nullptr, &chunked), tok->encode(*text, true, false));
    EXPECT_TRUE(chunked);
  }
}

TEST(PrepareText, EndToEndWithTrainedTokenizer) {
  const fs::path dir = scratch_dir();
  const std::string text = story_text(1500);
  const auto opt = base_options(dir, text);
  const auto res = lt::prepare_text(opt);

  // The trained tokenizer is published beside the output and stored inside it.
  const std::string model_path = (dir / "data.model").string();
  EXPECT_EQ(lt::tokenizer_model_path_for(opt.output_path), model_path);
  EXPECT_EQ(res.tokenizer_path, model_path);
  EXPECT_TRUE(res.tokenizer_trained);
  const auto tok = lt::Tokenizer::load(model_path);
  EXPECT_EQ(tok.vocab_size(), 300);

  const auto stream = tok.encode(text, true, false);
  const int64_t n_rows = (static_cast<int64_t>(stream.size()) - 1 + 31) / 32;
  EXPECT_EQ(res.stream_tokens, static_cast<int64_t>(stream.size()));
  EXPECT_EQ(res.train_rows + res.test_rows, n_rows);
  EXPECT_EQ(res.test_rows, std::llround(0.2 * n_rows));

  const auto d = lt::Dataset::load(opt.output_path);
  EXPECT_EQ(d.info.seq_len, 32);
  EXPECT_EQ(d.info.vocab_size, 300);
  EXPECT_EQ(d.info.bos_id, 1);
  EXPECT_EQ(d.info.eos_id, 2);
  EXPECT_EQ(d.info.seed, 7u);
  EXPECT_EQ(d.info.test_split, 0.2);
  EXPECT_EQ(d.info.prompt_template, "none");
  EXPECT_EQ(d.info.tool_version, LLAMATRAIN_VERSION);
  EXPECT_EQ(d.info.source_path, opt.text_path);
  EXPECT_EQ(d.info.source_sha256, lt::sha256_file(opt.text_path));
  EXPECT_EQ(d.info.tokenizer_sha256, lt::sha256_file(model_path));
  EXPECT_EQ(d.tokenizer_model, lt::read_file_bytes(model_path));
  EXPECT_EQ(d.train.n_seq, res.train_rows);
  EXPECT_EQ(d.test.n_seq, res.test_rows);

  // Train and test rows are exactly the packed rows chosen by split_rows, in original order.
  const auto rows = lt::pack_rows(stream, 32);
  const auto split = lt::split_rows(n_rows, 0.2, 7);
  ASSERT_EQ(static_cast<int64_t>(split.train.size()), d.train.n_seq);
  for (size_t i = 0; i < split.train.size(); ++i) ASSERT_EQ(row(d.train, i), row(rows, split.train[i]));
  for (size_t i = 0; i < split.test.size(); ++i) ASSERT_EQ(row(d.test, i), row(rows, split.test[i]));
  // Mask: column 0 off, everything else on except the padding of the very last row.
  const int64_t last = n_rows - 1;
  const int64_t valid_last = static_cast<int64_t>(stream.size()) - last * 32;
  for (const auto* s : {&d.train, &d.test})
    EXPECT_EQ(s->loss_tokens(), [&] {
      int64_t n = 0;
      const auto& ids = s == &d.train ? split.train : split.test;
      for (int64_t r : ids) n += r == last ? valid_last - 1 : 32;
      return n;
    }());
  EXPECT_EQ(d.train.loss_tokens() + d.test.loss_tokens(), static_cast<int64_t>(stream.size()) - 1);
  // The stored rows decode back to the text: train ∪ test == all rows.
  std::vector<int32_t> rebuilt = {stream[0]};
  std::vector<std::vector<int32_t>> by_index(n_rows);
  for (size_t i = 0; i < split.train.size(); ++i) by_index[split.train[i]] = row(d.train, i);
  for (size_t i = 0; i < split.test.size(); ++i) by_index[split.test[i]] = row(d.test, i);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t n = r == last ? valid_last : 33;
    rebuilt.insert(rebuilt.end(), by_index[r].begin() + 1, by_index[r].begin() + n);
  }
  EXPECT_EQ(rebuilt, stream);
  EXPECT_EQ(tok.decode(rebuilt), text);
  EXPECT_FALSE(lt::file_exists(lt::temp_path_for(opt.output_path)));
  fs::remove_all(dir);
}

TEST(PrepareText, SplitDependsOnlyOnSeed) {
  const fs::path dir = scratch_dir();
  auto opt = base_options(dir, story_text(1500));
  const auto load = [&](uint64_t seed, const std::string& name) {
    opt.seed = seed;
    opt.output_path = (dir / name).string();
    lt::prepare_text(opt);
    return lt::Dataset::load(opt.output_path);
  };
  const auto a = load(7, "a.h5"), b = load(7, "b.h5"), c = load(8, "c.h5");
  EXPECT_EQ(a.train.tokens, b.train.tokens);
  EXPECT_EQ(a.test.tokens, b.test.tokens);
  EXPECT_EQ(a.info.tokenizer_sha256, b.info.tokenizer_sha256);
  EXPECT_EQ(a.test.n_seq, c.test.n_seq);
  EXPECT_NE(a.test.tokens, c.test.tokens);
  // Same rows overall, only the assignment differs.
  EXPECT_EQ(a.train.n_seq + a.test.n_seq, c.train.n_seq + c.test.n_seq);
  EXPECT_EQ(a.train.loss_tokens() + a.test.loss_tokens(), c.train.loss_tokens() + c.test.loss_tokens());
  fs::remove_all(dir);
}

TEST(PrepareText, GivenTokenizerAndNoTestSplit) {
  const fs::path dir = scratch_dir();
  auto opt = base_options(dir, story_text(300));
  lt::prepare_text(opt);  // trains data.model
  const std::string model = (dir / "given.model").string();
  fs::rename(dir / "data.model", model);
  opt.tokenizer_path = model;
  opt.output_path = (dir / "out" / "second.h5").string();  // parent directory is created
  opt.test_split = 0;
  opt.seq_len = 1;
  const auto res = lt::prepare_text(opt);
  EXPECT_FALSE(res.tokenizer_trained);
  EXPECT_FALSE(lt::file_exists((dir / "out" / "second.model").string()));
  const auto d = lt::Dataset::load(opt.output_path);
  EXPECT_EQ(d.test.n_seq, 0);
  EXPECT_EQ(d.train.n_seq, res.stream_tokens - 1);  // L = 1: one row per target
  EXPECT_EQ(d.info.tokenizer_sha256, lt::sha256_file(model));
  fs::remove_all(dir);
}

TEST(PrepareText, BuiltinCorpus) {
  const fs::path dir = scratch_dir();
  lt::PrepareTextOptions opt;
  opt.text_path = lt::kBuiltinCorpusName;
  opt.output_path = (dir / "tales.h5").string();
  opt.seq_len = 64;
  opt.vocab_size = 512;
  opt.test_split = 0.05;
  opt.quiet = true;
  const auto res = lt::prepare_text(opt);
  const auto d = lt::Dataset::load(opt.output_path);
  EXPECT_EQ(d.info.source_path, "builtin:tinytales");
  EXPECT_EQ(d.info.source_sha256, lt::sha256_hex(lt::builtin_corpus()));
  EXPECT_EQ(d.info.vocab_size, 512);
  const auto tok = lt::Tokenizer::load((dir / "tales.model").string());
  EXPECT_EQ(res.stream_tokens, static_cast<int64_t>(tok.encode(lt::builtin_corpus(), true, false).size()));
  EXPECT_EQ(d.train.n_seq + d.test.n_seq, (res.stream_tokens - 1 + 63) / 64);
  // Only the dataset and the tokenizer files remain (the temporary training corpus is gone).
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"tales.h5", "tales.model", "tales.vocab"}));
  fs::remove_all(dir);
}

TEST(PrepareText, ErrorsNameTheCulprit) {
  const fs::path dir = scratch_dir();
  auto opt = base_options(dir, story_text(50));
  auto no_output = [&] {
    EXPECT_FALSE(lt::file_exists(opt.output_path));
    EXPECT_FALSE(lt::file_exists(lt::temp_path_for(opt.output_path)));
  };
  auto bad = opt;
  bad.text_path = (dir / "missing.txt").string();
  EXPECT_EQ(error_of([&] { lt::prepare_text(bad); }), bad.text_path + ": text file not found");
  bad = opt;
  bad.text_path = (dir / "empty.txt").string();
  lt::write_file_atomic(bad.text_path, "");
  EXPECT_EQ(error_of([&] { lt::prepare_text(bad); }), bad.text_path + ": empty text file");
  bad = opt;
  bad.seq_len = 0;
  EXPECT_EQ(error_of([&] { lt::prepare_text(bad); }), "--seq-len must be at least 1 (got 0)");
  bad = opt;
  bad.test_split = 1.0;
  EXPECT_EQ(error_of([&] { lt::prepare_text(bad); }), "--test-split must be in [0, 1) (got 1)");
  bad = opt;
  bad.tokenizer_path = (dir / "tok.model").string();
  lt::write_file_atomic(bad.tokenizer_path, "not a model at all\n");
  const std::string msg = error_of([&] { lt::prepare_text(bad); });
  EXPECT_EQ(msg.rfind(bad.tokenizer_path + ": not a SentencePiece model", 0), 0u) << msg;
  bad.tokenizer_path = (dir / "nope.model").string();
  EXPECT_EQ(error_of([&] { lt::prepare_text(bad); }), bad.tokenizer_path + ": tokenizer model not found");
  no_output();
  fs::remove_all(dir);
}

TEST(PrepareCli, OptionsAndExclusions) {
  CLI::App app{"test"};
  app.set_config("--config");
  lt::cli::PrepareOptions opt;
  CLI::App* sub = lt::cli::setup_prepare(app, opt);
  EXPECT_EQ(sub->get_name(), "prepare");
  // CLI11 takes a vector of arguments last-first.
  std::vector<std::string> args = {"prepare", "--text", "t.txt", "--seq-len", "128", "--output",
                                   "o.h5", "--vocab-size", "1000", "--tokenizer-type", "unigram",
                                   "--test-split", "0.05"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  EXPECT_EQ(opt.text, "t.txt");
  EXPECT_EQ(opt.seq_len, 128);
  EXPECT_EQ(opt.output, "o.h5");
  EXPECT_EQ(opt.vocab_size, 1000);
  EXPECT_EQ(opt.model_type, "unigram");
  EXPECT_EQ(opt.test_split, 0.05);
  EXPECT_EQ(opt.seed, 1234u);  // default kept

  auto parse = [](std::vector<std::string> args) {
    CLI::App a{"test"};
    lt::cli::PrepareOptions o;
    lt::cli::setup_prepare(a, o);
    std::reverse(args.begin(), args.end());
    a.parse(args);
  };
  EXPECT_THROW(parse({"prepare", "--text", "t", "--seq-len", "8", "--output", "o.h5",
                      "--tokenizer", "m.model", "--vocab-size", "1000"}),
               CLI::ExcludesError);
  EXPECT_THROW(parse({"prepare", "--text", "t", "--seq-len", "8"}), CLI::RequiredError);
  EXPECT_THROW(parse({"prepare", "--text", "t", "--seq-len", "8", "--output", "o.h5",
                      "--tokenizer-type", "wordpiece"}),
               CLI::ValidationError);
  EXPECT_NO_THROW(parse({"prepare", "--text", "t", "--seq-len", "8", "--output", "o.h5",
                         "--tokenizer", "m.model", "--seed", "5"}));
}

TEST(PrepareCli, ConfigFileSection) {
  const fs::path dir = scratch_dir();
  const std::string cfg = (dir / "run.toml").string();
  lt::write_file_atomic(cfg, "[prepare]\ntext = \"c.txt\"\nseq-len = 64\noutput = \"d.h5\"\nseed = 99\n");
  CLI::App app{"test"};
  app.set_config("--config");
  lt::cli::PrepareOptions opt;
  lt::cli::setup_prepare(app, opt);
  app.parse(std::vector<std::string>{"prepare", cfg, "--config"});  // last-first
  EXPECT_EQ(opt.text, "c.txt");
  EXPECT_EQ(opt.seq_len, 64);
  EXPECT_EQ(opt.output, "d.h5");
  EXPECT_EQ(opt.seed, 99u);
  fs::remove_all(dir);
}

#ifdef LLAMATRAIN_BINARY
TEST(PrepareCli, BinaryEndToEnd) {
  const fs::path dir = scratch_dir();
  const auto opt = base_options(dir, story_text(400));
  const std::string err = (dir / "stderr.txt").string();
  auto run = [&](const std::string& args) {
    const std::string cmd = lt::strcat(LLAMATRAIN_BINARY, " prepare ", args, " 2> ", err);
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(run(lt::strcat("--text ", opt.text_path, " --seq-len 16 --output ", opt.output_path,
                           " --vocab-size 300 --test-split 0.1 --seed 3")), 0)
      << lt::read_file_bytes(err);
  EXPECT_NE(lt::read_file_bytes(err).find("train +"), std::string::npos);
  const auto d = lt::Dataset::load(opt.output_path);
  EXPECT_EQ(d.info.seq_len, 16);
  EXPECT_EQ(d.info.seed, 3u);
  EXPECT_TRUE(lt::file_exists((dir / "data.model").string()));

  const std::string missing = (dir / "missing.txt").string();
  EXPECT_EQ(run(lt::strcat("--text ", missing, " --seq-len 16 --output ", (dir / "x.h5").string())), 1);
  EXPECT_NE(lt::read_file_bytes(err).find(missing + ": text file not found"), std::string::npos)
      << lt::read_file_bytes(err);
  EXPECT_NE(run(lt::strcat("--text ", opt.text_path, " --seq-len 16 --output ", (dir / "x.h5").string(),
                           " --tokenizer ", (dir / "data.model").string(), " --vocab-size 1000")),
            0);
  EXPECT_NE(lt::read_file_bytes(err).find("excludes"), std::string::npos) << lt::read_file_bytes(err);
  EXPECT_FALSE(lt::file_exists((dir / "x.h5").string()));
  fs::remove_all(dir);
}
#endif

TEST(Progress, PlainLinesWhenNotATerminal) {
  // Test output is captured, so stderr is not a terminal: plain lines, rate-limited.
  testing::internal::CaptureStderr();
  {
    lt::Progress p("tokenize", 200, "bytes", 0.0, 3600.0);
    p.update(50, "x");
    p.update(60);  // within log_every_s of the last line: not printed
    p.finish();
    p.finish();  // once only
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_EQ(out.rfind("tokenize  25% 50/200 bytes ", 0), 0u) << out;
  EXPECT_NE(out.find(" x\n"), std::string::npos) << out;
  EXPECT_NE(out.find("tokenize 100% 200/200 bytes "), std::string::npos) << out;

  testing::internal::CaptureStderr();
  {
    lt::Progress quick("fast", 10, "items");  // finishes before the 1.5 s delay: silent
    quick.update(10);
    quick.finish();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}
