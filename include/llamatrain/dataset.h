// The HDF5 dataset format (DESIGN.md "Formats"):
//   /                 attrs: format="llamatrain-dataset", format_version=1, seq_len, vocab_size,
//                            bos_id, eos_id, tokenizer_sha256, source_sha256, source_path,
//                            prompt_template ("none" for plain text), tool_version, seed,
//                            test_split, created_utc
//   /tokenizer/model  uint8 (n)            the SentencePiece model proto, so data carries its tokenizer
//   /train/tokens     int32 (n_seq, seq_len+1)  inputs = [:, :-1], targets = [:, 1:]
//   /train/loss_mask  uint8 (n_seq, seq_len+1)  mask[:, j] = 1 when token j is a target with loss
//                                               (column 0 is always 0)
//   /test/...         the same for the held-out split (may have 0 rows)
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
};

struct TokenSplit {
  int64_t n_seq = 0;
  int seq_len = 0;                // tokens per row = seq_len + 1
  std::vector<int32_t> tokens;    // (n_seq, seq_len+1)
  std::vector<uint8_t> loss_mask; // (n_seq, seq_len+1)
  int64_t loss_tokens() const;    // count of mask ones
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
