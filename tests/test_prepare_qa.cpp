// prepare --qa: answer-only masks, packing that never splits an example, positions that
// restart at each example (the packed loss equals the examples' losses run alone), context
// truncation, deterministic splits, the dataset round trip, and the CLI paths around it.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "llamatrain/builtin_qa.h"
#include "llamatrain/config.h"
#include "llamatrain/dataset.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/loader.h"
#include "llamatrain/model.h"
#include "llamatrain/prepare.h"
#include "llamatrain/qa.h"
#include "llamatrain/qa_eval.h"
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
    ASSERT_TRUE(tokenize_example(tok, r, PromptFormat::from_prompt_type(type), 400, &ex));
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
  ASSERT_TRUE(tokenize_example(tok, r, PromptFormat::from_prompt_type(3), 100000, &full));
  ASSERT_GT(full.tokens.size(), 120u);
  ASSERT_TRUE(tokenize_example(tok, r, PromptFormat::from_prompt_type(3), 120, &cut));
  EXPECT_TRUE(cut.truncated);
  EXPECT_FALSE(full.truncated);
  EXPECT_LE(cut.tokens.size(), 120u);
  EXPECT_GE(cut.tokens.size(), 110u) << "the cut should not throw away much more than needed";
  // The answer is intact.
  const std::vector<int32_t> a(cut.tokens.begin() + cut.answer_offset, cut.tokens.end() - 1);
  EXPECT_EQ(tok.decode(a), r.answer + "<END_A>");
  QaExample none;
  EXPECT_FALSE(tokenize_example(tok, r, PromptFormat::from_prompt_type(3), 12, &none));
}

TEST(QaPacking, ExamplesNeverStraddleRowsAndPositionsRestart) {
  const Tokenizer& tok = qa_tokenizer();
  QaReadReport rep;
  const std::string jsonl = scratch() + "/pack.jsonl";
  write_file_atomic(jsonl, builtin_qa_jsonl(60, 3));
  std::vector<QaExample> ex;
  for (const auto& r : read_qa_file(jsonl, {}, &rep)) {
    ex.emplace_back();
    ASSERT_TRUE(tokenize_example(tok, r, PromptFormat::from_prompt_type(3), 401, &ex.back()));
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
  ASSERT_TRUE(tokenize_example(tok, record("Is the red ball in the park?", "Tom keeps the red ball in the park.", "yes. Tom keeps the red ball in the park."), PromptFormat::from_prompt_type(3), 200, &ex[0]));
  ASSERT_TRUE(tokenize_example(tok, record("Is the cup in the shed?", "Sam left the cup in the boat.", "no. Sam left the cup in the boat."), PromptFormat::from_prompt_type(3), 200, &ex[1]));
  ASSERT_TRUE(tokenize_example(tok, record("Is the hat in the barn?", "", "maybe. The context does not say where the hat is."), PromptFormat::from_prompt_type(3), 200, &ex[2]));
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

// prepare --decision-weight: an answer that ends with its label ("...\nFinal decision: no", or the
// label alone) has the label's tokens and the answer's end (suffix, EOS) weighted, the rest of the
// answer 1; a dataset keeps the weight, and a mask above it is refused on load.
TEST(QaExample, DecisionWeightCoversTheLabelAndTheAnswersEnd) {
  const Tokenizer& tok = qa_tokenizer();
  for (int type : {1, 2, 3})
    for (const std::string answer : {"Tom keeps the red ball in the park.\nFinal decision: no", "no"}) {
      const QaRecord r = record("Is the red ball in the shed?", "Tom keeps the red ball in the park.", answer, "no");
      QaExample ex;
      ASSERT_TRUE(tokenize_example(tok, r, PromptFormat::from_prompt_type(type), 400, &ex));
      ASSERT_GE(ex.decision_offset, ex.answer_offset);
      const std::vector<int32_t> decision(ex.tokens.begin() + ex.decision_offset, ex.tokens.end() - 1);
      EXPECT_EQ(tok.decode(decision), "no" + answer_suffix(type)) << "type " << type << ": " << answer;
      const TokenSplit s = pack_examples({ex}, 400, false, 7);
      for (int j = 0; j < int(ex.tokens.size()); ++j)
        EXPECT_EQ(s.loss_mask[size_t(j)], j >= ex.decision_offset ? 7 : j >= ex.answer_offset ? 1 : 0)
            << "type " << type << " j " << j;
    }
  // An answer that does not end with its label has no decision.
  QaExample plain;
  ASSERT_TRUE(tokenize_example(tok, record("Is it?", "", "It is not said.", "maybe"), PromptFormat::from_prompt_type(3),
                               400, &plain));
  EXPECT_EQ(plain.decision_offset, -1);

  Dataset d;
  d.info.seq_len = 399;
  d.info.vocab_size = tok.vocab_size();
  QaExample ex;
  ASSERT_TRUE(tokenize_example(tok, record("Is it?", "", "no", "no"), PromptFormat::from_prompt_type(3), 400, &ex));
  d.train = pack_examples({ex}, 399, false, 7);
  d.test = pack_examples({}, 399, false);
  const std::string path = scratch() + "/qa_weighted.h5";
  d.info.decision_weight = 7;
  d.save(path);
  EXPECT_EQ(Dataset::load(path).info.decision_weight, 7);
  EXPECT_EQ(Dataset::load(path).train.loss_mask, d.train.loss_mask);
  d.info.decision_weight = 1;  // the attribute says no weights: the 7s are refused
  d.save(path);
  EXPECT_NE(error_of([&] { Dataset::load(path); }).find("/train/loss_mask[0, "), std::string::npos);
  EXPECT_NE(error_of([&] { Dataset::load(path); }).find("] = 7, expected 0 or 1"), std::string::npos);
}

TEST(QaDataset, SaveLoadKeepsPositionsAndExamples) {
  const Tokenizer& tok = qa_tokenizer();
  std::vector<QaExample> ex(2);
  QaRecord a = record("Is the cup in the shed?", "Sam left the cup in the boat.", "no. Sam left the cup in the boat.", "no");
  a.id = "first";
  QaRecord b = record("Is the hat in the barn?", "", "maybe. Not said.", "maybe");
  b.id = "second\nline";
  ASSERT_TRUE(tokenize_example(tok, a, PromptFormat::from_prompt_type(2), 100, &ex[0]));
  ASSERT_TRUE(tokenize_example(tok, b, PromptFormat::from_prompt_type(2), 100, &ex[1]));
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

TEST(QaExample, LeadBelongsToThePromptSide) {
  const Tokenizer& tok = qa_tokenizer();
  const QaRecord r = record("Is the red ball in the park?", "Tom keeps the red ball in the park.", "yes");
  const std::string lead = std::string("Tom keeps it there.") + kFinalDecisionLead;
  QaExample with_lead;
  ASSERT_TRUE(tokenize_example(tok, r, PromptFormat(), 400, &with_lead, false, lead));
  const std::vector<int32_t> prompt(with_lead.tokens.begin() + 1, with_lead.tokens.begin() + with_lead.answer_offset);
  const std::vector<int32_t> answer(with_lead.tokens.begin() + with_lead.answer_offset, with_lead.tokens.end());
  // The candidate's tokens carry "yes" (SentencePiece may join the space before it to the word);
  // everything before is prompt and lead.
  EXPECT_EQ(tok.decode(answer), "yes");
  const std::string head = PromptFormat().prompt(r.question, r.context) + "Tom keeps it there.\nFinal decision:";
  EXPECT_EQ(tok.decode(prompt).substr(0, head.size()), head);
  EXPECT_LE(tok.decode(prompt).size(), head.size() + 1);
}

// A prompt that ends in a space (llama2-chat's " [/INST] ", "Answer: {answer}"): generation starts
// from the tokens training has before the answer. Llama 2's tokenizer joins the space to the
// answer's first piece ("▁Tom"), so the prompt encoded alone (ending in a lone "▁") is not what
// training shows; a small tokenizer that keeps "▁" alone keeps it.
TEST(QaGeneration, PromptTokensAreTheTrainedPromptSide) {
  const std::string llama_path = testing::kSharedData + "/llama2-tokenizer.model";
  if (!file_exists(llama_path)) GTEST_SKIP() << "llama2-tokenizer.model absent";
  const Tokenizer llama = Tokenizer::load(llama_path);
  const QaRecord r = record("Is the red ball in the park?", "Tom keeps the red ball in the park.",
                            "Tom keeps the red ball in the park.");
  for (const Tokenizer* tok : {&llama, &qa_tokenizer()}) {
    for (const PromptFormat& f :
         {PromptFormat::llama2_chat(), PromptFormat::from_template("Q: {question} Answer: {answer}")}) {
      QaExample ex;
      ASSERT_TRUE(tokenize_example(*tok, r, f, 100000, &ex));
      const std::vector<int32_t> trained(ex.tokens.begin(), ex.tokens.begin() + ex.answer_offset);
      const std::string prompt = f.prompt(r.question, r.context);
      ASSERT_EQ(prompt.back(), ' ');
      EXPECT_EQ(generation_prompt_tokens(*tok, r, f), trained) << f.to_string();
      if (tok == &llama) {
        EXPECT_NE(tok->encode(prompt, true, false), trained) << f.to_string();  // the lone "▁"
        // Without a reference answer: the prompt without its trailing space, as training has it here.
        QaRecord no_answer = r;
        no_answer.answer.clear();
        EXPECT_EQ(generation_prompt_tokens(*tok, no_answer, f), trained) << f.to_string();
      }
    }
  }
  EXPECT_EQ(generation_prompt("A:  "), "A:");
  EXPECT_EQ(generation_prompt("### Response:\n"), "### Response:\n");  // a newline is the prompt's own piece
}

// --answer-field both: the context is cut once, for generation, with room for the lead and the
// longest candidate; a record that generates is scored in that context and never found too long
// afterwards.
TEST(QaGeneration, ARecordThatGeneratesIsScoredInTheSameContext) {
  const Tokenizer& tok = qa_tokenizer();
  Llama2Config cfg = preset_config("tiny");
  cfg.vocab_size = tok.vocab_size();
  cfg.max_seq_len = 128;
  Llama2Model model(cfg);
  model.init_random(11);
  QaEvalOptions opt;
  opt.format = PromptFormat::from_prompt_type(3);
  opt.answer_field = AnswerField::kBoth;
  opt.max_new_tokens = 8;
  int scored = 0, too_long = 0;
  for (int k = 2; k < 60; k += 2) {
    std::string q = "Is the cup";
    for (int j = 0; j < k; ++j) q += " red";
    const QaEvalResult r = evaluate_yes_no_maybe(*make_cpu_evaluator(model), model, tok, {record(q + "?", "", "yes", "yes")}, opt);
    ASSERT_EQ(r.examples + r.too_long, 1) << k;
    if (r.too_long == 1) EXPECT_EQ(r.generated_tokens, 0) << k << ": generated, then refused as too long";
    scored += int(r.examples);
    too_long += int(r.too_long);
  }
  EXPECT_GT(scored, 0);
  EXPECT_GT(too_long, 0);
  // A long context is cut for generation, and the scoring uses what generation kept.
  std::string context;
  for (int j = 0; j < 40; ++j) context += "Sam left the cup in the boat. ";
  const QaRecord long_ctx = record("Is the cup in the shed?", context, "no", "no");
  GeneratedAnswer g;
  CpuDecoder writer(model, model.config().max_seq_len);
  ASSERT_TRUE(generate_long_answer(writer, model.config(), tok, long_ctx, opt, &g));
  EXPECT_TRUE(g.truncated);
  EXPECT_LT(g.context.size(), context.size());
  EXPECT_EQ(g.tokens, 8);
}

// ---- prepare --test-ids, --answer-field, --template ---------------------------------------------

// 12 records p1..p12 with labels yes/no/maybe in turn: p5 repeats p4 (curation drops it), p9 has
// a question too long for --seq-len 96 even without its context.
std::string test_id_records() {
  std::string out;
  for (int i = 1; i <= 12; ++i) {
    const int k = i == 5 ? 4 : i;
    std::string q = "Is the cup number " + std::to_string(k) + " in the shed?";
    if (i == 9)
      for (int j = 0; j < 40; ++j) q += " Is the red ball in the park?";
    const char* label = k % 3 == 0 ? "yes" : k % 3 == 1 ? "no" : "maybe";
    out += R"({"id": "p)" + std::to_string(i) + R"(", "question": ")" + q +
           R"(", "context": "Sam left the cup in the boat.", "answer": ")" + label +
           R"(. Sam left the cup in the boat.", "final_decision": ")" + label + "\"}\n";
  }
  const std::string path = scratch() + "/test_ids_records.jsonl";
  write_file_atomic(path, out);
  return path;
}

PrepareQaOptions test_id_options(const std::string& name) {
  qa_tokenizer();  // writes scratch()/qa_tok.model
  PrepareQaOptions o;
  o.qa_path = test_id_records();
  o.tokenizer_path = scratch() + "/qa_tok.model";
  o.output_path = scratch() + "/" + name + ".h5";
  o.format = PromptFormat::from_prompt_type(3);  // the tokenizer's markers
  o.seq_len = 96;
  o.test_split = 0;
  o.quiet = true;
  return o;
}

std::vector<std::string> ids_of(const TokenSplit& s) {
  std::vector<std::string> v;
  for (const auto& e : s.examples) v.push_back(e.id);
  return v;
}

TEST(PrepareQaTestIds, EachFileFormPutsExactlyTheListedIdsInTest) {
  const std::vector<std::pair<std::string, std::string>> forms = {
      {"array", R"(["p2", "p5", "p7", "p9", "p11"])"},
      {"object", R"({"p2": "maybe", "p5": "no", "p7": "no", "p9": "yes", "p11": "maybe"})"},
      {"lines", "p2\n  p5\n\np7 \r\np9\np11\n"},
  };
  for (const auto& [form, text] : forms) {
    PrepareQaOptions o = test_id_options("ids_" + form);
    o.test_ids_path = scratch() + "/ids_" + form + ".txt";
    write_file_atomic(o.test_ids_path, text);
    const PrepareQaResult r = prepare_qa(o);
    const Dataset d = Dataset::load(o.output_path);
    // p5 (a duplicate) and p9 (too long) are dropped: listed, not in test, counted.
    EXPECT_EQ(ids_of(d.test), (std::vector<std::string>{"p2", "p7", "p11"})) << form;
    EXPECT_EQ(ids_of(d.train), (std::vector<std::string>{"p1", "p3", "p4", "p6", "p8", "p10", "p12"})) << form;
    EXPECT_EQ(r.test_ids.listed, 5);
    EXPECT_EQ(r.test_ids.in_test, 3);
    EXPECT_EQ(r.test_ids.dropped, 2);
    EXPECT_EQ(r.test_ids.dropped_ids, (std::vector<std::string>{"p5", "p9"}));
    const auto report = nlohmann::json::parse(d.info.curation_report);
    EXPECT_EQ(report["test_ids"], nlohmann::json({{"listed", 5}, {"in_test", 3}, {"dropped", 2}})) << report.dump();
    EXPECT_EQ(report["dropped"]["duplicate"], 1);
    EXPECT_EQ(report["dropped"]["too_long"], 1);
    EXPECT_EQ(d.info.test_ids_path, o.test_ids_path);
    EXPECT_EQ(d.info.test_ids_sha256, sha256_file(o.test_ids_path));
    EXPECT_EQ(d.info.test_split, 0.0);
  }
  // --test-split chooses the split: no test_ids attributes, no test_ids report.
  PrepareQaOptions o = test_id_options("by_split");
  o.test_split = 0.2;
  prepare_qa(o);
  const Dataset d = Dataset::load(o.output_path);
  EXPECT_EQ(d.info.test_ids_path, "");
  EXPECT_EQ(d.info.test_ids_sha256, "");
  EXPECT_EQ(d.test.examples.size(), 2u);  // 0.2 of the 10 kept
  EXPECT_FALSE(nlohmann::json::parse(d.info.curation_report).contains("test_ids"));
}

TEST(PrepareQaTestIds, MissingIdsAndASecondSplitAreRefused) {
  PrepareQaOptions o = test_id_options("missing");
  o.test_ids_path = scratch() + "/missing.json";
  write_file_atomic(o.test_ids_path, R"(["p99", "p2", "p100", "p101", "p102"])");
  EXPECT_EQ(error_of([&] { prepare_qa(o); }),
            o.test_ids_path + ": 4 of the 5 listed ids are not among the 12 records read from " + o.qa_path +
                ", e.g. 'p99', 'p100', 'p101', ...");
  EXPECT_FALSE(file_exists(o.output_path));
  write_file_atomic(o.test_ids_path, R"(["p2"])");
  o.test_split = 0.1;
  EXPECT_EQ(error_of([&] { prepare_qa(o); }),
            "--test-ids " + o.test_ids_path + " and --test-split 0.1 both choose the test split; choose one");
  // The command line: --test-split given with --test-ids is refused unless it is 0.
  const std::string base = "prepare --qa " + o.qa_path + " --tokenizer " + o.tokenizer_path + " --prompt-type 3 --seq-len 96 --test-ids " +
                           o.test_ids_path + " --output " + o.output_path;
  const auto refused = run_cli(base + " --test-split 0.2");
  EXPECT_EQ(refused.status, 1);
  EXPECT_EQ(refused.err, "llamatrain prepare: error: --test-ids " + o.test_ids_path +
                             " and --test-split 0.2 both choose the test split; choose one\n");
  const auto zero = run_cli(base + " --test-split 0");
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_NE(zero.err.find("1 ids listed, 1 in the test split, 0 dropped"), std::string::npos) << zero.err;
  EXPECT_EQ(ids_of(Dataset::load(o.output_path).test), (std::vector<std::string>{"p2"}));
}

TEST(PrepareQaTestIds, ListsLeavingNoTrainOrNoTestExampleAreRefused) {
  PrepareQaOptions o = test_id_options("cover_all");
  o.test_ids_path = scratch() + "/cover_all.json";
  nlohmann::json all = nlohmann::json::array();
  for (int i = 1; i <= 12; ++i) all.push_back("p" + std::to_string(i));
  write_file_atomic(o.test_ids_path, all.dump());
  EXPECT_EQ(error_of([&] { prepare_qa(o); }),
            "--test-ids " + o.test_ids_path + ": the listed ids cover all 10 examples kept from " + o.qa_path +
                "; none is left to train on");
  EXPECT_FALSE(file_exists(o.output_path));
  // p5 (a duplicate) and p9 (too long) are dropped: nothing is left to test.
  write_file_atomic(o.test_ids_path, R"(["p5", "p9"])");
  EXPECT_EQ(error_of([&] { prepare_qa(o); }),
            "--test-ids " + o.test_ids_path + ": none of the 2 listed ids is left for the test split: all were dropped "
            "(curation or --seq-len 96), e.g. 'p5', 'p9'");
  EXPECT_FALSE(file_exists(o.output_path));
}

// The answer tokens of each example of a split, decoded (EOS left out).
std::vector<std::string> answers_of(const TokenSplit& s, const Tokenizer& tok) {
  std::vector<std::string> out;
  for (const auto& e : s.examples) {
    const int32_t* row = s.row_tokens(e.row) + e.offset;
    out.push_back(tok.decode(std::vector<int32_t>(row + e.answer_offset, row + e.length - 1)));
  }
  return out;
}

TEST(PrepareQaAnswerField, EachFieldTrainsItsTextAndIsStored) {
  const Tokenizer& tok = qa_tokenizer();
  const std::vector<std::pair<AnswerField, std::string>> cases = {
      {AnswerField::kLongAnswer, "no. Sam left the cup in the boat."},
      {AnswerField::kFinalDecision, "no"},
      {AnswerField::kBoth, "no. Sam left the cup in the boat.\nFinal decision: no"},
  };
  for (const auto& [field, first] : cases) {
    PrepareQaOptions o = test_id_options(std::string("field_") + answer_field_name(field));
    o.answer_field = field;
    prepare_qa(o);
    const Dataset d = Dataset::load(o.output_path);
    EXPECT_EQ(d.info.answer_field, answer_field_name(field));
    EXPECT_EQ(d.info.prompt_format, R"({"name":"qa-section-markers"})");
    EXPECT_EQ(d.info.prompt_type, 3);
    ASSERT_EQ(d.train.examples.size(), 10u);
    const std::vector<std::string> answers = answers_of(d.train, tok);
    EXPECT_EQ(answers[0], first + "<END_A>") << answer_field_name(field);  // p1: "no", then the layout's suffix
    if (field == AnswerField::kFinalDecision)
      EXPECT_EQ(answers, (std::vector<std::string>{"no<END_A>", "maybe<END_A>", "yes<END_A>", "no<END_A>", "yes<END_A>",
                                                   "no<END_A>", "maybe<END_A>", "no<END_A>", "maybe<END_A>", "yes<END_A>"}));
  }
}

TEST(PrepareQaTemplate, TemplateAndLlama2ChatAreTrainedAndStored) {
  const Tokenizer& tok = qa_tokenizer();
  PrepareQaOptions o = test_id_options("template");
  o.format = PromptFormat::from_template("Q: {question}\nA: {answer} END");
  o.answer_field = AnswerField::kFinalDecision;
  prepare_qa(o);
  Dataset d = Dataset::load(o.output_path);
  EXPECT_EQ(d.info.prompt_template, "template");
  EXPECT_EQ(d.info.prompt_type, 0);
  EXPECT_EQ(PromptFormat::parse(d.info.prompt_format), o.format);
  EXPECT_EQ(answers_of(d.train, tok)[0], "no END");
  const ExampleSpan& e = d.train.examples[0];
  const int32_t* row = d.train.row_tokens(e.row) + e.offset;
  const std::string prompt = tok.decode(std::vector<int32_t>(row + 1, row + e.answer_offset));
  EXPECT_EQ(prompt.substr(0, 38), "Q: Is the cup number 1 in the shed?\nA:") << prompt;  // the space may join "no"
  EXPECT_LE(prompt.size(), 39u);
  o.format = PromptFormat::llama2_chat("Answer yes, no or maybe.");
  prepare_qa(o);
  d = Dataset::load(o.output_path);
  EXPECT_EQ(PromptFormat::parse(d.info.prompt_format).prompt("q", "c"),
            "[INST] <<SYS>>\nAnswer yes, no or maybe.\n<</SYS>>\n\nq\n\nc [/INST] ");
  EXPECT_EQ(answers_of(d.train, tok)[0], "no");
}

TEST(QaDataset, FilesWithoutTheNewAttributesStillLoad) {
  PrepareQaOptions o = test_id_options("old_attrs");
  o.format = PromptFormat::from_prompt_type(3);
  prepare_qa(o);
  // A file of an older build: no prompt_format, answer_field or test_ids_* attributes.
  const hid_t f = H5Fopen(o.output_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const char* name : {"prompt_format", "answer_field", "test_ids_path", "test_ids_sha256"})
    EXPECT_GE(H5Adelete(f, name), 0) << name;
  H5Fclose(f);
  const Dataset d = Dataset::load(o.output_path);
  EXPECT_EQ(d.info.prompt_format, "");
  EXPECT_EQ(d.info.answer_field, "");
  EXPECT_EQ(d.info.test_ids_path, "");
  EXPECT_EQ(d.info.prompt_type, 3);
  EXPECT_EQ(d.train.examples.size(), 10u);
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

TEST(EvalTaskCli, AModelWithoutATrainingRecordGetsOneNoteWithIds) {
  const std::string model = testing::kSharedData + "/stories260K.bin", tok = testing::kSharedData + "/tok512.model";
  if (!file_exists(model) || !file_exists(tok)) GTEST_SKIP() << "stories260K.bin or tok512.model absent";
  const std::string ids = scratch() + "/two_ids.json";
  write_file_atomic(ids, R"({"factqa-1": "no", "factqa-2": "yes"})");
  const auto r = run_cli("eval --model " + model + " --tokenizer " + tok + " --task pubmedqa --qa builtin:factqa --ids " +
                         ids + " --json --no-progress");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string note = "eval: note: trained ids not checked: " + model + " records no training (a llama2.c or "
                           "Hugging Face model, or a checkpoint saved before training records were kept)";
  const size_t at = r.err.find(note);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("trained ids not checked", at + note.size()), std::string::npos) << r.err;  // once
  EXPECT_EQ(nlohmann::json::parse(r.out)["examples"], 2);
}

// ---- PubMedQA as users run it (the real files of ../shared/data) -----------------------------------

const std::string kOriPqal = testing::kSharedData + "/ori_pqal.json";
const std::string kGroundTruth = testing::kSharedData + "/test_ground_truth.json";
const std::string kTok512 = testing::kSharedData + "/tok512.model";

bool have_pubmedqa() { return file_exists(kOriPqal) && file_exists(kGroundTruth) && file_exists(kTok512); }

TEST(PubmedqaCli, TestIdsHoldOutExactlyTheOfficialTestSet) {
  if (!have_pubmedqa()) GTEST_SKIP() << "PubMedQA files absent from " << testing::kSharedData;
  const std::string out = scratch() + "/pq_official.h5";
  const auto r = run_cli("prepare --qa " + kOriPqal + " --tokenizer " + kTok512 + " --answer-field final_decision " +
                         "--test-ids " + kGroundTruth + " --seq-len 256 --output " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  const IdList official = read_id_file(kGroundTruth);
  ASSERT_EQ(official.ids.size(), 500u);
  const Dataset d = Dataset::load(out);
  const auto report = nlohmann::json::parse(d.info.curation_report);
  const int64_t dropped = report["test_ids"]["dropped"];
  EXPECT_EQ(report["test_ids"]["listed"], 500);
  EXPECT_EQ(report["test_ids"]["in_test"], 500 - dropped);
  EXPECT_EQ(dropped, 0);  // ori_pqal.json holds every official test id; none is a duplicate or too long
  std::set<std::string> test_ids, train_ids;
  for (const auto& e : d.test.examples) test_ids.insert(e.id);
  for (const auto& e : d.train.examples) train_ids.insert(e.id);
  EXPECT_EQ(test_ids, std::set<std::string>(official.ids.begin(), official.ids.end()));
  EXPECT_EQ(d.test.examples.size(), 500u);
  for (const std::string& id : official.ids) EXPECT_EQ(train_ids.count(id), 0u) << id;
  EXPECT_EQ(d.train.examples.size(), 500u);
  EXPECT_EQ(d.info.answer_field, "final_decision");
  EXPECT_EQ(d.info.test_ids_path, kGroundTruth);
  EXPECT_EQ(d.info.test_ids_sha256, sha256_file(kGroundTruth));
  // The labels are those of the ground truth.
  std::map<std::string, std::string> truth;
  for (size_t i = 0; i < official.ids.size(); ++i) truth[official.ids[i]] = official.labels[i];
  int same = 0;
  for (const auto& e : d.test.examples) same += truth[e.id] == label_name(e.label);
  EXPECT_EQ(same, 500);
  EXPECT_NE(r.err.find("500 ids listed, 500 in the test split, 0 dropped"), std::string::npos) << r.err;
}

// A tiny model (max_seq_len 256: the Alpaca prompt takes about 150 of tok512's tokens) trained for
// one step on PubMedQA split by --test-split 0.02 (final_decision answers; 20 test records keep
// the evaluations short).
struct TrainedOnSplit {
  std::string data, model;
};
const TrainedOnSplit& trained_on_split() {
  static const TrainedOnSplit t = [] {
    TrainedOnSplit r{scratch() + "/pq_split.h5", scratch() + "/pq_model"};
    auto p = run_cli("prepare --qa " + kOriPqal + " --tokenizer " + kTok512 + " --answer-field final_decision " +
                     "--test-split 0.02 --seed 3 --seq-len 256 --output " + r.data);
    EXPECT_EQ(p.status, 0) << p.err;
    auto t = run_cli("train --model-config tiny --max-seq-len 256 --vocab-size 512 --data " + r.data +
                     " --max-steps 1 --batch-size 2 --no-progress --output " + r.model);
    EXPECT_EQ(t.status, 0) << t.err;
    r.model += "/model.h5";
    return r;
  }();
  return t;
}

// The first n train ids of a dataset, as a JSON array file.
std::string train_ids_file(const std::string& data, size_t n, const std::string& name) {
  nlohmann::json ids = nlohmann::json::array();
  const Dataset d = Dataset::load(data);
  for (size_t i = 0; i < n; ++i) ids.push_back(d.train.examples[i].id);
  const std::string path = scratch() + "/" + name;
  write_file_atomic(path, ids.dump());
  return path;
}

TEST(PubmedqaCli, EvalRefusesIdsTheModelWasTrainedOn) {
  if (!have_pubmedqa()) GTEST_SKIP() << "PubMedQA files absent from " << testing::kSharedData;
  const TrainedOnSplit& t = trained_on_split();
  const std::string ids = train_ids_file(t.data, 5, "trained5.json");
  const std::string eval = "eval --model " + t.model + " --task pubmedqa --qa " + kOriPqal + " --json --ids ";
  const auto refused = run_cli(eval + ids);
  EXPECT_EQ(refused.status, 1);
  EXPECT_NE(refused.err.find("eval --task pubmedqa: 5 of the 5 ids to score are in the train split of "),
            std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("pq_split.h5, which " + t.model + " was trained on ('"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--allow-trained-ids"), std::string::npos);
  EXPECT_EQ(refused.out, "");
  const auto allowed = run_cli(eval + ids + " --allow-trained-ids");
  ASSERT_EQ(allowed.status, 0) << allowed.err;
  EXPECT_NE(allowed.err.find("eval: warning: 5 of the 5 ids to score are in the train split"), std::string::npos)
      << allowed.err;
  EXPECT_EQ(nlohmann::json::parse(allowed.out)["examples"], 5);
  // Held-out ids (the dataset's own test split, 20 records) are scored without a word, in the
  // format and answer field the data was prepared with.
  const auto held_out = run_cli(eval + t.data);
  ASSERT_EQ(held_out.status, 0) << held_out.err;
  EXPECT_EQ(nlohmann::json::parse(held_out.out)["examples"], 20);
  EXPECT_EQ(held_out.err.find("warning"), std::string::npos) << held_out.err;
  EXPECT_NE(held_out.err.find("prompt format alpaca, answers final_decision (as " + t.data + " was prepared)"),
            std::string::npos) << held_out.err;
}

TEST(PubmedqaCli, EvalRefusesAFormatOtherThanTheDatasetsAndNotesAnUncheckableModel) {
  if (!have_pubmedqa()) GTEST_SKIP() << "PubMedQA files absent from " << testing::kSharedData;
  const TrainedOnSplit& t = trained_on_split();
  const std::string eval = "eval --model " + t.model + " --task pubmedqa --qa " + kOriPqal + " --ids " + t.data;
  auto r = run_cli(eval + " --prompt-type 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("eval --task: the prompt format given, {\"name\":\"qa-inline-markers\"}, differs from "
                       "{\"name\":\"alpaca\"} that " + t.data + " was prepared with"),
            std::string::npos) << r.err;
  r = run_cli(eval + " --answer-field long_answer");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("eval --task: --answer-field long_answer differs from final_decision that " + t.data),
            std::string::npos) << r.err;
  r = run_cli(eval + " --prompt-type 1 --answer-field final_decision --no-progress");  // the same: accepted
  EXPECT_EQ(r.status, 0) << r.err;
  // The training data gone: one note, and the score.
  const std::string moved = t.data + ".moved";
  ASSERT_EQ(std::rename(t.data.c_str(), moved.c_str()), 0);
  const std::string ids = scratch() + "/two.txt";
  write_file_atomic(ids, Dataset::load(moved).train.examples[0].id + "\n" + Dataset::load(moved).train.examples[1].id + "\n");
  r = run_cli("eval --model " + t.model + " --task pubmedqa --qa " + kOriPqal + " --ids " + ids + " --json");
  std::rename(moved.c_str(), t.data.c_str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("eval: note: trained ids not checked: its training data " + t.data + " is absent\n"),
            std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["examples"], 2);
}

TEST(PubmedqaCli, AnswerFieldBothWritesTheLongAnswerBeforeScoring) {
  if (!have_pubmedqa()) GTEST_SKIP() << "PubMedQA files absent from " << testing::kSharedData;
  const TrainedOnSplit& t = trained_on_split();
  // The three test records with the shortest questions: the Alpaca prompt (about 150 tokens of
  // tok512) and room for 64 generated tokens fit in 256 without their contexts.
  std::map<std::string, size_t> question_bytes;
  for (const QaRecord& r : read_qa_file(kOriPqal, {}, nullptr)) question_bytes[r.id] = r.question.size();
  std::vector<std::pair<size_t, std::string>> by_length;
  for (const auto& e : Dataset::load(t.data).test.examples) by_length.emplace_back(question_bytes[e.id], e.id);
  std::sort(by_length.begin(), by_length.end());
  const std::string ids = scratch() + "/test3.json";
  write_file_atomic(ids, nlohmann::json({by_length[0].second, by_length[1].second, by_length[2].second}).dump());
  const auto r = run_cli("eval --model " + t.model + " --task pubmedqa --qa " + kOriPqal + " --ids " + ids +
                         " --answer-field both --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["examples"], 3);
  // max_seq_len 256: at most a quarter, 64 tokens, of long answer each.
  EXPECT_LE(j["generated_tokens"].get<int64_t>(), 3 * 64);
  EXPECT_GE(j["generated_tokens"].get<int64_t>(), 0);
  EXPECT_LE(j["final_decision_lead_found"].get<int64_t>(), 3);
  const auto plain = run_cli("eval --model " + t.model + " --task pubmedqa --qa " + kOriPqal + " --ids " + ids + " --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("generated_tokens"));
}

}  // namespace
}  // namespace lt
