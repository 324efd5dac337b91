// prepare --qa: answer-only masks, packing that never splits an example, positions that
// restart at each example (the packed loss equals the examples' losses run alone), context
// truncation, deterministic splits, the dataset round trip, and the CLI paths around it.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "llamatrain/builtin_qa.h"
#include "llamatrain/dataset.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/loader.h"
#include "llamatrain/model.h"
#include "llamatrain/prepare.h"
#include "llamatrain/qa.h"
#include "llamatrain/tokenizer.h"
#include "test_util.h"

namespace lt {
namespace {

using testing::error_of;
using testing::run_cli;
using testing::scratch;

// A tokenizer trained on a slice of the built-in set, the prompt-3 markers as single pieces;
// built once per process.
const Tokenizer& qa_tokenizer() {
  static const Tokenizer tok = [] {
    const std::string text_path = scratch() + "/qa_tok.txt";
    std::string text;
    QaReadReport rep;
    const std::string jsonl = scratch() + "/qa_small.jsonl";
    write_file_atomic(jsonl, builtin_qa_jsonl(300, 5));
    for (const auto& r : read_qa_file(jsonl, {}, &rep)) text += prompt_text(3, r.question, r.context) + r.answer + "\n";
    write_file_atomic(text_path, text);
    TokenizerTrainOptions o;
    o.input_path = text_path;
    o.model_prefix = scratch() + "/qa_tok";
    o.vocab_size = 300;
    o.user_defined_symbols = prompt_markers(3);
    return Tokenizer::load(train_tokenizer(o));
  }();
  return tok;
}

QaRecord record(const std::string& q, const std::string& c, const std::string& a, const std::string& label = "") {
  QaRecord r;
  r.id = "r";
  r.question = q;
  r.context = c;
  r.answer = a;
  r.label = label;
  return r;
}

TEST(QaExample, MaskCoversExactlyTheAnswerSuffixAndEos) {
  const Tokenizer& tok = qa_tokenizer();
  for (int type : {1, 2, 3}) {
    const QaRecord r = record("Is the red ball in the park?", "Tom keeps the red ball in the park.",
                              "yes. Tom keeps the red ball in the park.", "yes");
    QaExample ex;
    ASSERT_TRUE(tokenize_example(tok, r, type, 400, &ex));
    EXPECT_EQ(ex.tokens.front(), tok.bos_id());
    EXPECT_EQ(ex.tokens.back(), tok.eos_id());
    EXPECT_EQ(ex.label, 0);
    const std::vector<int32_t> prompt(ex.tokens.begin() + 1, ex.tokens.begin() + ex.answer_offset);
    const std::vector<int32_t> answer(ex.tokens.begin() + ex.answer_offset, ex.tokens.end() - 1);
    EXPECT_EQ(tok.decode(answer), r.answer + answer_suffix(type)) << "type " << type;
    EXPECT_EQ(tok.decode(prompt) + tok.decode(answer), prompt_text(type, r.question, r.context) + r.answer + answer_suffix(type));
    // The packed mask: 0 on BOS and the prompt, 1 from the first answer token through EOS.
    const TokenSplit s = pack_examples({ex}, 400, false);
    for (int j = 0; j < int(ex.tokens.size()); ++j)
      EXPECT_EQ(s.loss_mask[size_t(j)], j >= ex.answer_offset ? 1 : 0) << "type " << type << " j " << j;
    const TokenSplit all = pack_examples({ex}, 400, true);
    for (int j = 0; j < int(ex.tokens.size()); ++j) EXPECT_EQ(all.loss_mask[size_t(j)], j > 0 ? 1 : 0);
  }
}

TEST(QaExample, LongContextIsCutFromTheEndAndTooLongExamplesAreRefused) {
  const Tokenizer& tok = qa_tokenizer();
  std::string context;
  for (int i = 0; i < 40; ++i) context += "Sam keeps the blue cup in the shed. ";
  const QaRecord r = record("Is the blue cup in the shed?", context, "yes. Sam keeps the blue cup in the shed.");
  QaExample full, cut;
  ASSERT_TRUE(tokenize_example(tok, r, 3, 100000, &full));
  ASSERT_GT(full.tokens.size(), 120u);
  ASSERT_TRUE(tokenize_example(tok, r, 3, 120, &cut));
  EXPECT_TRUE(cut.truncated);
  EXPECT_FALSE(full.truncated);
  EXPECT_LE(cut.tokens.size(), 120u);
  EXPECT_GE(cut.tokens.size(), 110u) << "the cut should not throw away much more than needed";
  // The answer is intact.
  const std::vector<int32_t> a(cut.tokens.begin() + cut.answer_offset, cut.tokens.end() - 1);
  EXPECT_EQ(tok.decode(a), r.answer + "<END_A>");
  QaExample none;
  EXPECT_FALSE(tokenize_example(tok, r, 3, 12, &none));
}

TEST(QaPacking, ExamplesNeverStraddleRowsAndPositionsRestart) {
  const Tokenizer& tok = qa_tokenizer();
  QaReadReport rep;
  const std::string jsonl = scratch() + "/pack.jsonl";
  write_file_atomic(jsonl, builtin_qa_jsonl(60, 3));
  std::vector<QaExample> ex;
  for (const auto& r : read_qa_file(jsonl, {}, &rep)) {
    ex.emplace_back();
    ASSERT_TRUE(tokenize_example(tok, r, 3, 401, &ex.back()));
  }
  const int L = 400;
  const TokenSplit s = pack_examples(ex, L, false);
  ASSERT_EQ(s.examples.size(), ex.size());
  int64_t placed = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    const ExampleSpan& sp = s.examples[i];
    ASSERT_LE(sp.offset + sp.length, L + 1) << "example " << i << " straddles a row";
    for (int j = 0; j < sp.length; ++j) {
      const size_t at = size_t(sp.row) * (L + 1) + size_t(sp.offset + j);
      ASSERT_EQ(s.tokens[at], ex[i].tokens[size_t(j)]);
      ASSERT_EQ(s.positions[at], j);
    }
    placed += sp.length;
  }
  // Greedy in order: a new row starts only when the next example does not fit.
  for (size_t i = 1; i < ex.size(); ++i)
    if (s.examples[i].row != s.examples[i - 1].row)
      EXPECT_GT(s.examples[i - 1].offset + s.examples[i - 1].length + s.examples[i].length, L + 1);
  int64_t nonpad = 0;
  for (int64_t r = 0; r < s.n_seq; ++r)
    for (int c = 0; c <= L; ++c) nonpad += s.tokens[size_t(r * (L + 1) + c)] != 0 || s.positions[size_t(r * (L + 1) + c)] != 0;
  EXPECT_EQ(placed, nonpad);
  std::printf("%zu examples in %lld rows of %d\n", ex.size(), (long long)s.n_seq, L + 1);
}

// The loss of a packed row equals the sum of the losses of its examples run alone: the loader
// turns positions into RoPE positions and attention boundaries.
TEST(QaPacking, PackedLossEqualsSumOfSeparateLosses) {
  const Tokenizer& tok = qa_tokenizer();
  std::vector<QaExample> ex(3);
  ASSERT_TRUE(tokenize_example(tok, record("Is the red ball in the park?", "Tom keeps the red ball in the park.", "yes. Tom keeps the red ball in the park."), 3, 200, &ex[0]));
  ASSERT_TRUE(tokenize_example(tok, record("Is the cup in the shed?", "Sam left the cup in the boat.", "no. Sam left the cup in the boat."), 3, 200, &ex[1]));
  ASSERT_TRUE(tokenize_example(tok, record("Is the hat in the barn?", "", "maybe. The context does not say where the hat is."), 3, 200, &ex[2]));
  const int L = int(ex[0].tokens.size() + ex[1].tokens.size() + ex[2].tokens.size()) + 5;
  const TokenSplit packed = pack_examples(ex, L, false);
  ASSERT_EQ(packed.n_seq, 1);
  Llama2Config cfg = preset_config("tiny");
  cfg.vocab_size = tok.vocab_size();
  cfg.max_seq_len = L;
  Llama2ModelT<float> model(cfg);
  model.init_random(17);
  for (auto& p : model.params()) p *= 20.0f;  // larger weights: attention leaks would show
  MicroBatch mb;
  mb.fill(packed, {0});
  const double together = model.forward(mb.batch());
  double alone = 0;
  for (const auto& e : ex) {
    const TokenSplit one = pack_examples({e}, int(e.tokens.size()) - 1, false);
    MicroBatch m1;
    m1.fill(one, {0});
    alone += model.forward(m1.batch());
  }
  std::printf("packed %.6f, separate %.6f\n", together, alone);
  EXPECT_NEAR(together, alone, 1e-4 * std::abs(alone));
  // Without the boundaries (plain causal attention over the whole row) the loss differs.
  Batch plain = mb.batch();
  plain.pos = nullptr;
  plain.seg_start = nullptr;
  EXPECT_GT(std::abs(model.forward(plain) - alone), 1e-2);
}

TEST(QaDataset, SaveLoadKeepsPositionsAndExamples) {
  const Tokenizer& tok = qa_tokenizer();
  std::vector<QaExample> ex(2);
  QaRecord a = record("Is the cup in the shed?", "Sam left the cup in the boat.", "no. Sam left the cup in the boat.", "no");
  a.id = "first";
  QaRecord b = record("Is the hat in the barn?", "", "maybe. Not said.", "maybe");
  b.id = "second\nline";
  ASSERT_TRUE(tokenize_example(tok, a, 2, 100, &ex[0]));
  ASSERT_TRUE(tokenize_example(tok, b, 2, 100, &ex[1]));
  Dataset d;
  d.info.seq_len = 299;
  d.info.vocab_size = tok.vocab_size();
  d.info.prompt_type = 2;
  d.info.curation_report = R"({"kept":2})";
  d.train = pack_examples(ex, 299, false);
  d.test = pack_examples({}, 299, false);
  ASSERT_EQ(d.train.n_seq, 1);
  const std::string path = scratch() + "/qa_roundtrip.h5";
  d.save(path);
  const Dataset back = Dataset::load(path);
  EXPECT_EQ(back.train.tokens, d.train.tokens);
  EXPECT_EQ(back.train.positions, d.train.positions);
  ASSERT_EQ(back.train.examples.size(), 2u);
  EXPECT_EQ(back.train.examples[0].id, "first");
  EXPECT_EQ(back.train.examples[1].id, "second\nline");  // one string per example: kept as it is
  EXPECT_EQ(back.train.examples[1].label, 2);
  EXPECT_EQ(back.train.examples[1].offset, ex[0].tokens.size());
  EXPECT_EQ(back.info.prompt_type, 2);
  EXPECT_EQ(back.info.curation_report, R"({"kept":2})");
}

TEST(PrepareQaCli, SplitIsDeterministicAndHoldsWholeExamples) {
  auto prep = [](const std::string& name, int seed) {
    const std::string out = scratch() + "/" + name + ".h5";
    auto r = run_cli("prepare --qa builtin:factqa --prompt-type 2 --vocab-size 400 --seq-len 128 --test-split 0.1 --seed " +
                     std::to_string(seed) + " --output " + out);
    EXPECT_EQ(r.status, 0) << r.err;
    return Dataset::load(out);
  };
  const Dataset a = prep("s1a", 1), b = prep("s1b", 1), c = prep("s2", 2);
  auto ids = [](const TokenSplit& s) {
    std::vector<std::string> v;
    for (const auto& e : s.examples) v.push_back(e.id);
    return v;
  };
  EXPECT_EQ(ids(a.test), ids(b.test));
  EXPECT_NE(ids(a.test), ids(c.test));
  EXPECT_EQ(a.test.examples.size(), 400u);
  EXPECT_EQ(a.train.examples.size() + a.test.examples.size(), 4000u);
  const auto report = nlohmann::json::parse(a.info.curation_report);
  EXPECT_EQ(report["kept"], 4000);
  EXPECT_EQ(report["records"], 4000);
}

TEST(PrepareQaCli, BadRecordsStopWithTheLineOrAreSkippedAndListed) {
  const std::string path = scratch() + "/bad.jsonl";
  write_file_atomic(path,
                    "{\"question\": \"q1?\", \"context\": \"c\", \"answer\": \"a one\"}\n"
                    "{\"question\": \"q2?\", \"answer\": \"a two\"}\n"
                    "{\"question\": \"q3?\", \"context\": \"c\"}\n"
                    "not json\n"
                    "{\"question\": \"q5?\", \"context\": \"c\", \"answer\": \"a five\"}\n");
  const std::string out = scratch() + "/bad.h5";
  auto r = run_cli("prepare --qa " + path + " --seq-len 64 --vocab-size 300 --output " + out);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(path + ":3: missing field \"answer\""), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(out));
  qa_tokenizer();  // writes scratch()/qa_tok.model
  auto s = run_cli("prepare --qa " + path + " --prompt-type 3 --seq-len 128 --tokenizer " + scratch() + "/qa_tok.model --test-split 0 --skip-invalid --output " + out);
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_NE(s.err.find("skipped 2 invalid"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find(path + ":4:"), std::string::npos) << s.err;
  EXPECT_EQ(Dataset::load(out).train.examples.size(), 3u);
}

TEST(EvalTaskCli, IdsSelectRecordsAndUnknownIdsAreReported) {
  // A freshly initialised model: accuracy is whatever it is, but every selected record is scored.
  const std::string data = scratch() + "/task.h5", dir = scratch() + "/task_model";
  ASSERT_EQ(run_cli("prepare --qa builtin:factqa --prompt-type 3 --vocab-size 400 --seq-len 128 --test-split 0.05 --output " + data).status, 0);
  auto t = run_cli("train --model-config tiny --vocab-size 400 --data " + data + " --max-steps 1 --save-init --output " + dir + " --no-progress");
  ASSERT_EQ(t.status, 0) << t.err;
  auto e = run_cli("eval --model " + dir + "/init.h5 --task pubmedqa --qa builtin:factqa --ids " + data + " --prompt-type 3 --json");
  ASSERT_EQ(e.status, 0) << e.err;
  const auto j = nlohmann::json::parse(e.out);
  EXPECT_EQ(j["examples"], 200);
  int64_t total = 0;
  for (const char* a : {"yes", "no", "maybe"})
    for (const char* b : {"yes", "no", "maybe"}) total += j["confusion"][a][b].get<int64_t>();
  EXPECT_EQ(total, 200);
  const std::string ids = scratch() + "/ids.json";
  write_file_atomic(ids, R"({"factqa-1": "no", "factqa-2": "yes", "nosuch": "maybe"})");
  auto bad = run_cli("eval --model " + dir + "/init.h5 --task pubmedqa --qa builtin:factqa --ids " + ids);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("nosuch"), std::string::npos) << bad.err;
  // Data made with another tokenizer is refused.
  const std::string other = scratch() + "/other.h5";
  ASSERT_EQ(run_cli("prepare --qa builtin:factqa --prompt-type 3 --vocab-size 350 --seq-len 128 --output " + other).status, 0);
  auto refused = run_cli("eval --model " + dir + "/init.h5 --data " + other);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("another tokenizer"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace lt
