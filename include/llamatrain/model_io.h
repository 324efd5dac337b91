// Model files: the project's HDF5 model file and llama2.c v0 ".bin" (LLAMA2C_BIN_FORMAT.md).
// Formats are recognised by content, never by extension alone.
//
// HDF5 model file:
//   /                  attrs: format="llamatrain-model", format_version=1, tool_version,
//                             dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
//                             max_seq_len, norm_eps, rope_theta, tied_embeddings (0/1)
//   /weights/<name>    float32, one dataset per named tensor of ParameterLayout, its shape
//   /extras/<name>     float32 tensors kept only to re-export losslessly (llama2.c's
//                      freq_cis_real/freq_cis_imag tables)
//   /tokenizer/model   uint8, the SentencePiece model proto, when known
#pragma once
#include <map>
#include <string>
#include <vector>

#include "llamatrain/config.h"

namespace lt {

enum class ModelFormat { kHdf5, kLlama2c };
const char* model_format_name(ModelFormat f);

struct ModelData {
  Llama2Config config;
  std::vector<float> params;  // flat, in ParameterLayout(config) order
  std::map<std::string, std::vector<float>> extras;
  std::string tokenizer_model;  // serialized SentencePiece proto, may be empty
};

// Throws lt::Error naming the file and what is wrong (missing, not a model, truncated, a header
// that disagrees with the size, an unsupported llama2.c version, a missing tensor...).
ModelFormat detect_model_format(const std::string& path);
ModelData load_model(const std::string& path);
// Header (config) only, cheap; validates the file like load_model would.
Llama2Config read_model_config(const std::string& path);

// Both writers publish atomically (temporary name, then rename).
void save_model_hdf5(const std::string& path, const ModelData& model);
// Writes llama2.c v0: negative vocab_size when the classifier is not shared. freq_cis tables
// come from extras when present (bit-exact round trip), else are computed as llama2.c's
// export does (float32 cos/sin of t * theta^(-2i/hd)).
void save_model_llama2c(const std::string& path, const ModelData& model);

}  // namespace lt
