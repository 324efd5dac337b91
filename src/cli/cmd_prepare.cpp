// `llamatrain prepare`: plain text -> tokenized HDF5 dataset. The work is in
// src/data/prepare_text.cpp; this file maps the command line onto PrepareTextOptions.
#include <filesystem>
#include <limits>

#include "cli/commands.h"
#include "cli/ranges.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/memory.h"
#include "llamatrain/prepare.h"
#include "llamatrain/runtime.h"

namespace lt::cli {

// A trained tokenizer has byte fallback: the 256 byte pieces and <unk>, <s>, </s>, plus at least
// one piece learned from the text.
constexpr int kMinTrainedVocab = 260;

CLI::App* setup_prepare(CLI::App& root, PrepareOptions& opt) {
  CLI::App* sub = root.add_subcommand(
      "prepare",
      "Tokenize a plain-text file into an HDF5 dataset of packed rows of seq_len+1 tokens "
      "(train/test split, loss mask, tokenizer stored inside). Without --tokenizer a "
      "SentencePiece tokenizer is trained on the text and saved beside the output as "
      "<output without .h5>.model");
  auto* text = sub->add_option("--text", opt.text,
                               "Plain text file (UTF-8), tokenized as one stream after one BOS; "
                               "builtin:tinytales for the embedded story corpus");
  auto* qa = sub->add_option("--qa", opt.qa,
                             "Question/context/answer records for fine-tuning: JSON lines or a JSON "
                             "array of {question, context, answer[, id, final_decision]}, or "
                             "PubMedQA's ori_pqal.json; builtin:factqa for the embedded set (4000 "
                             "records), builtin:factqa:N for N of them");
  text->excludes(qa);
  add_prompt_options(sub, opt.prompt, "--qa: ",
                     "prompt layout (default 1): 1 Alpaca, 2 <START_Q>q c<END_Q><START_A>a<END_A>, "
                     "3 <START_Q>q<END_Q><START_C>c<END_C><START_A>a<END_A>");
  sub->add_option("--answer-field", opt.answer_field,
                  "--qa: what each record is trained on: long_answer (the answer text), final_decision (its "
                  "yes/no/maybe label; every record needs one) or both (the answer, then a last line "
                  "\"Final decision: <label>\")")
      ->check(CLI::IsMember({"long_answer", "final_decision", "both"}))
      ->capture_default_str();
  sub->add_option("--test-ids", opt.test_ids,
                  "--qa: the test split is exactly the records of these ids, every other record is train: a JSON "
                  "array of ids, a JSON object keyed by id (test_ground_truth.json) or one id per line; instead of "
                  "--test-split");
  sub->add_flag("--train-on-prompt", opt.train_on_prompt, "--qa: put the prompt tokens back into the loss");
  in_range(sub->add_option("--decision-weight", opt.decision_weight,
                           "--qa with --answer-field both or final_decision: each answer's decision (the yes/no/maybe "
                           "label it ends with, and the answer's end) counts this many times in the loss (the loss is "
                           "the weighted mean; eval's loss of the data too)")
               ->capture_default_str(),
           ints_between(1, 255));
  in_range(
      sub->add_option("--min-answer-tokens", opt.min_answer_tokens, "--qa: drop records whose answer has fewer tokens")
          ->capture_default_str(),
      ints_from(0));
  sub->add_flag("--skip-invalid", opt.skip_invalid,
                "--qa: skip malformed records (reported with their lines) instead of stopping; --text: drop "
                "bytes that are not valid UTF-8 (counted) instead of refusing the file");
  sub->add_flag("--compare-sentencepiece", opt.compare_sentencepiece,
                "--qa: also time SentencePiece's own encoding of the same texts and print the ratio");
  in_range(sub->add_option("--seq-len", opt.seq_len, "Sequence length L: rows hold L+1 tokens and overlap by one token")
               ->required(),
           ints_from(1));
  sub->add_option("--output", opt.output, "Dataset file to write (HDF5), e.g. data.h5")->required();
  auto* tokenizer = sub->add_option("--tokenizer", opt.tokenizer,
                                    "Existing SentencePiece .model to use instead of training one");
  auto* vocab =
      in_range(sub->add_option("--vocab-size", opt.vocab_size, "Vocabulary size of the tokenizer trained on the text")
                   ->capture_default_str(),
               ints_from(kMinTrainedVocab));
  auto* type = sub->add_option("--tokenizer-type", opt.model_type,
                               "SentencePiece model type of the trained tokenizer")
                   ->check(CLI::IsMember({"bpe", "unigram"}))
                   ->capture_default_str();
  // Training settings make no sense with a given model; refuse the combination instead of
  // silently ignoring one of them.
  tokenizer->excludes(vocab);
  tokenizer->excludes(type);
  opt.test_split_option =
      add_real(sub, "--test-split", opt.test_split,
               "Fraction of rows held out as /test, in [0, 1) (at least one row when > 0; --test-ids: 0)",
               reals_in(0, 1, "[)"))
          ->capture_default_str();
  in_range(sub->add_option("--seed", opt.seed, "Seed of the train/test split and of tokenizer training")
               ->capture_default_str(),
           ints_from<uint64_t>(0));
  return sub;
}

namespace {

// Before any reading or tokenizing: the input and at least one row must fit in memory
// (prepare_peak_bytes), and a row of L+1 tokens must be indexable with an int.
void check_prepare_sizes(const PrepareOptions& opt) {
  const std::string& input = opt.text.empty() ? opt.qa : opt.text;
  const bool builtin = input.rfind("builtin:", 0) == 0;
  const double input_bytes = !builtin && file_exists(input) ? double(file_size(input)) : 0;
  const double need = prepare_peak_bytes(input_bytes, 2, opt.seq_len);
  const std::string what = strcat("prepare --seq-len ", opt.seq_len, " (", input_bytes,
                                  " bytes of input and at least one row of ", int64_t(opt.seq_len) + 1,
                                  " tokens and loss-mask bytes, held twice)");
  if (opt.seq_len >= std::numeric_limits<int>::max())
    fail(strcat(what, " would need ", bytes_text(need), "; --seq-len is at most ", std::numeric_limits<int>::max() - 1));
  // By the input's size, not the machine's: a token covers at least one byte of text (or of a JSON
  // record), and each record or line adds at most its BOS and EOS, so a row longer than twice the
  // input could hold nothing but padding (--seq-len 1000000000 on 1 MB passed the memory check).
  // Asked of rows that take memory worth refusing (64 MiB); a small padded row is harmless.
  const double max_tokens = 2 * input_bytes + 2;
  const double row_bytes = 2 * (double(opt.seq_len) + 1) * (sizeof(int32_t) + sizeof(uint8_t));
  if (input_bytes > 0 && row_bytes > double(64 << 20) && double(opt.seq_len) + 1 > max_tokens)
    fail(strcat("prepare --seq-len ", opt.seq_len, ": ", input, " (", int64_t(input_bytes), " bytes) makes at most ",
                int64_t(max_tokens), " tokens, fewer than one row of ", int64_t(opt.seq_len) + 1,
                "; use a --seq-len below that"));
  check_memory_fits(need, what, "use a smaller --seq-len");
}

// The file of --template @FILE, else "".
std::string prepare_template_file(const PromptCliOptions& p) {
  return p.template_text.size() > 1 && p.template_text[0] == '@' ? p.template_text.substr(1) : "";
}

// The --qa options that --text would silently ignore.
void refuse_qa_options_with_text(const PrepareOptions& opt) {
  if (opt.text.empty()) return;
  if (opt.prompt.given()) fail("--prompt-type, --template and --system are for --qa");
  if (!opt.test_ids.empty()) fail("--test-ids is for --qa (records with ids)");
  if (opt.answer_field != "long_answer") fail("--answer-field is for --qa");
}

// The dataset (and a trained tokenizer) from --text or --qa.
void run_prepare_job(const PrepareOptions& opt) {
  PrepareCommonOptions common;
  common.output_path = opt.output;
  common.seq_len = opt.seq_len;
  common.tokenizer_path = opt.tokenizer;
  common.vocab_size = opt.vocab_size;
  common.model_type = opt.model_type;
  common.test_split = opt.test_split;
  common.seed = opt.seed;
  if (!opt.qa.empty()) {
    PrepareQaOptions q;
    static_cast<PrepareCommonOptions&>(q) = common;
    q.qa_path = opt.qa;
    q.format = prompt_format_of(opt.prompt, PromptFormat::from_prompt_type(1));
    q.answer_field = parse_answer_field(opt.answer_field);
    q.test_ids_path = opt.test_ids;
    // --test-ids chooses the test split: --test-split defaults to 0 then (prepare_qa refuses another).
    const bool split_given = opt.test_split_option != nullptr && opt.test_split_option->count() > 0;
    if (!opt.test_ids.empty() && !split_given) q.test_split = 0;
    q.train_on_prompt = opt.train_on_prompt;
    q.decision_weight = opt.decision_weight;
    q.min_answer_tokens = opt.min_answer_tokens;
    q.skip_invalid = opt.skip_invalid;
    q.compare_sentencepiece = opt.compare_sentencepiece;
    prepare_qa(q);
    return;
  }
  PrepareTextOptions p;
  static_cast<PrepareCommonOptions&>(p) = common;
  p.text_path = opt.text;
  p.skip_invalid = opt.skip_invalid;
  prepare_text(p);
}

}  // namespace

int run_prepare(const PrepareOptions& opt) {
  // Preparing data is a one-process job. Under mpirun (e.g. a batch script that launches every
  // step the same way) rank 0 does it and the other ranks have nothing to do, instead of N
  // processes tokenizing the same text and racing to publish the same files.
  if (world().rank != 0) return 0;
  if (opt.text.empty() == opt.qa.empty()) fail("give exactly one of --text FILE or --qa FILE");
  // The dataset and a trained tokenizer (its .model and .vocab) go beside each other; none of them
  // may be an input, and the directory must be writable: fail now, not after tokenizing.
  std::vector<NamedPath> outputs = {{"--output", opt.output}};
  if (opt.tokenizer.empty()) {
    const std::string model = tokenizer_model_path_for(opt.output);
    const std::string vocab = model.substr(0, model.size() - std::string(".model").size()) + ".vocab";
    outputs.push_back({"--output (the tokenizer trained beside it)", model});
    outputs.push_back({"--output (the tokenizer's vocabulary beside it)", vocab});
  }
  refuse_qa_options_with_text(opt);
  refuse_output_over_input(outputs, {{"--text", opt.text},
                                     {"--qa", opt.qa},
                                     {"--tokenizer", opt.tokenizer},
                                     {"--test-ids", opt.test_ids},
                                     {"--template", prepare_template_file(opt.prompt)}});
  check_writable_dir(std::filesystem::path(opt.output).parent_path().string(), "--output");
  check_prepare_sizes(opt);
  // A prepare that fails (a full disk while the dataset is written) takes back the tokenizer files
  // it made beside --output, so nothing of it is left looking finished.
  std::vector<std::string> made;
  for (size_t i = 1; i < outputs.size(); ++i)
    if (!file_exists(outputs[i].path)) made.push_back(outputs[i].path);
  try {
    run_prepare_job(opt);
  } catch (...) {
    for (const std::string& f : made) std::remove(f.c_str());
    throw;
  }
  return 0;
}

}  // namespace lt::cli
