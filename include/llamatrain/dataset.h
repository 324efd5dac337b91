// The HDF5 dataset format (DESIGN.md "Formats"):
//   /                 attrs: format="llamatrain-dataset", format_version=2, seq_len, vocab_size,
//                            bos_id, eos_id, tokenizer_sha256, source_sha256, source_path,
//                            prompt_template ("none" for plain text), tool_version, seed,
//                            test_split, created_utc
//   /tokenizer/model  uint8 (n)            the SentencePiece model proto, so data carries its tokenizer
//   /train/tokens     int32 (n_seq, seq_len+1)  inputs = [:, :-1], targets = [:, 1:]
//   /train/loss_mask  uint8 (n_seq, seq_len+1)  mask[:, j] = 1 when token j is a target with loss
//                                               (column 0 is always 0)
//   /test/...         the same for the held-out split (may have 0 rows)
// Packed fine-tuning data (prepare --qa) adds, per split:
//   /train/positions  int32 (n_seq, seq_len+1)  RoPE position of each token inside its example
//                                               (0 at each example's first token, also 0 on
//                                               padding); attention never crosses a position-0
//                                               boundary, so examples in one row stay independent
//   /train/examples/{row,offset,length,answer_offset}  int64/int32 (n_examples): where each
//                     example lies (row, first column, tokens) and where its answer starts
//   /train/examples/label  enum over int8 (n_examples): members yes=0, no=1, maybe=2, none=-1
//                          (format_version 1: plain int8 codes, also read)
//   /train/examples/ids    variable-length UTF-8 strings (n_examples): one id per row
//                          (format_version 1: uint8 of the ids joined by '\n', also read)
// and root attributes
//   prompt_type      1, 2, 3 for the --prompt-type layouts; 0 for plain text and other formats
//   prompt_format    the prompt format (qa.h PromptFormat::to_string(), a JSON object)
//   answer_field     what the answers are: long_answer | final_decision | both (qa.h AnswerField)
//   test_ids_path, test_ids_sha256   the file of prepare --test-ids that chose the test split and
//                    its SHA-256; both "" when --test-split chose it
//   train_on_prompt, curation_report (JSON; with --test-ids its "test_ids" counts the listed ids
//                    {"listed", "in_test", "dropped"})
// Every attribute after format_version is optional on reading: files of older builds have no
// prompt_format, answer_field or test_ids_* (read as "": the format then follows prompt_type, the
// answers are long answers, the split was by --test-split), and keep format_version 2.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

struct DatasetInfo {
  int seq_len = 0;
  int vocab_size = 0;
  int bos_id = 1;
  int eos_id = 2;
  std::string tokenizer_sha256;
  std::string source_sha256;
  std::string source_path;
  std::string prompt_template = "none";
  std::string tool_version;
  uint64_t seed = 0;
  double test_split = 0.0;
  int prompt_type = 0;              // 0: plain text or a format without a number; 1, 2, 3: prompt layouts of qa.h
  std::string prompt_format;        // PromptFormat::to_string(); "": plain text, or a file older than it
  std::string answer_field;         // "long_answer" | "final_decision" | "both"; "": plain text or older
  std::string test_ids_path;        // prepare --test-ids FILE; "": the split is by test_split
  std::string test_ids_sha256;
  bool train_on_prompt = false;
  // prepare --decision-weight: the loss mask's value on each answer's decision (the label it ends
  // with, then the answer's end); 1 elsewhere. A mask value is a token's weight in the loss.
  int decision_weight = 1;
  std::string curation_report;      // JSON, empty for plain text
};

// Where one packed example lies in a split.
struct ExampleSpan {
  int64_t row = 0;
  int32_t offset = 0;         // first column of the example in its row
  int32_t length = 0;         // tokens, BOS through EOS
  int32_t answer_offset = 0;  // first answer token, relative to offset
  int8_t label = -1;          // 0 yes, 1 no, 2 maybe, -1 none
  std::string id;
};

struct TokenSplit {
  int64_t n_seq = 0;
  int seq_len = 0;                // tokens per row = seq_len + 1
  std::vector<int32_t> tokens;    // (n_seq, seq_len+1)
  std::vector<uint8_t> loss_mask; // (n_seq, seq_len+1)
  std::vector<int32_t> positions; // (n_seq, seq_len+1), or empty: position = column, one example per row
  std::vector<ExampleSpan> examples;  // packed examples, empty for plain text
  int64_t loss_tokens() const;    // count of mask ones
  bool packed() const { return !positions.empty(); }
  const int32_t* row_positions(int64_t i) const { return positions.data() + i * (seq_len + 1); }
  const int32_t* row_tokens(int64_t i) const { return tokens.data() + i * (seq_len + 1); }
  const uint8_t* row_mask(int64_t i) const { return loss_mask.data() + i * (seq_len + 1); }
};

struct Dataset {
  std::string path;
  DatasetInfo info;
  std::string tokenizer_model;  // serialized SentencePiece proto (may be empty)
  TokenSplit train;
  TokenSplit test;

  // Reads and validates the whole file; errors name the file and the field at fault
  // (e.g. "data.h5: /train/tokens has 129 columns, expected seq_len+1 = 257").
  static Dataset load(const std::string& path);
  // Writes atomically (temporary name, then rename).
  void save(const std::string& path) const;
};

}  // namespace lt
