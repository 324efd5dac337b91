// Model files: the project's HDF5 model file, llama2.c v0 ".bin" (LLAMA2C_BIN_FORMAT.md) and the
// Hugging Face layout (config.json + safetensors, hf_model.h). Formats are recognised by
// content, never by extension alone.
//
// A training checkpoint (checkpoint.h) is read as a model too: its fp32 master weights, model
// config and the tokenizer of its training data (when the data had one); see load_model.
//
// HDF5 model file:
//   /                  attrs: format="llamatrain-model", format_version=1, tool_version,
//                             dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
//                             max_seq_len, norm_eps, rope_theta, tied_embeddings (0/1)
//   /weights/<name>    float32, one dataset per named tensor of ParameterLayout, its shape
//   /extras/<name>     float32 tensors kept only to re-export losslessly (llama2.c's
//                      freq_cis_real/freq_cis_imag tables)
//   /tokenizer/model   uint8, the SentencePiece model proto, when known
//   /training          attrs only: how `train` made it (h5_attrs.h TrainingRecord), when it did
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llamatrain/config.h"
#include "llamatrain/h5_attrs.h"

namespace lt {
class ParameterLayout;
}

namespace lt {

enum class ModelFormat { kHdf5, kLlama2c, kHf, kCheckpoint };
const char* model_format_name(ModelFormat f);

struct ModelData {
  Llama2Config config;
  std::vector<float> params;  // flat, in ParameterLayout(config) order
  std::map<std::string, std::vector<float>> extras;
  std::string tokenizer_model;  // serialized SentencePiece proto, may be empty
  std::optional<TrainingRecord> training;  // how `train` made it (HDF5 model files only)
  ModelFormat format = ModelFormat::kHdf5;  // what it was read from
  std::string source;                       // the file or directory read (for a checkpoint: D/step-N)
  // For the user, on stderr: which checkpoint a checkpoint root resolved to, and the damaged
  // ones skipped on the way.
  std::vector<std::string> notes;
};

// Throws lt::Error naming the file and what is wrong (missing, not a model, truncated, a header
// that disagrees with the size, an unsupported llama2.c version, a missing tensor...).
// `path` is a file, or for the HF layout a directory with config.json (or one of its
// .safetensors files), or a training checkpoint:
//   D/step-N (or its checkpoint.h5)  that checkpoint; a damaged one is an error naming the file;
//   D/best                            the checkpoint train --keep-best kept (the step it names);
//   D or D/latest                     the newest complete D/step-N that loads and passes its
//                                     checksums, skipping damaged ones with a note, as
//                                     `train --resume auto` does.
// Only the weights of a checkpoint are read (and checksummed), not its Adam moments.
ModelFormat detect_model_format(const std::string& path);
ModelData load_model(const std::string& path);
// Header (config) only, cheap; validates the file like load_model would.
Llama2Config read_model_config(const std::string& path);

// An HDF5 model file (ModelFormat::kHdf5) without its weights (params empty; every tensor's shape
// checked), and the flat elements [begin, end) of its weights into out: what a ZeRO-3 rank reads of
// --init-from, so that it never holds the whole weights (at most a row of a tensor more).
ModelData load_model_header(const std::string& path);
void read_model_range(const std::string& path, const ParameterLayout& layout, size_t begin, size_t end, float* out);

// Both writers publish atomically (temporary name, then rename).
void save_model_hdf5(const std::string& path, const ModelData& model);

// The HDF5 model file written a tensor at a time, for a writer that never holds the whole weights
// (ZeRO 3's shards, gathered one tensor at a time): the header (config, training record,
// tokenizer, extras; header.params is not read) on construction, then write_tensor() for every
// tensor of ParameterLayout(header.config) in layout order, then finish(), which publishes the file
// atomically. Destroyed unfinished (an error on the way), it removes its temporary: no partial
// file is left under either name.
class ModelFileWriter {
 public:
  ModelFileWriter(const std::string& path, const ModelData& header);
  ~ModelFileWriter();
  ModelFileWriter(const ModelFileWriter&) = delete;
  ModelFileWriter& operator=(const ModelFileWriter&) = delete;
  // The next tensor's values (its numel floats).
  void write_tensor(const float* values);
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Writes llama2.c v0: negative vocab_size when the classifier is not shared. freq_cis tables
// come from extras when present (bit-exact round trip), else are computed as llama2.c's
// export does (float32 cos/sin of t * theta^(-2i/hd)).
void save_model_llama2c(const std::string& path, const ModelData& model);

struct HfExportOptions {
  bool bf16 = false;  // store bf16 (rounded to nearest even) instead of fp32
  // Above this many tensor bytes the weights go to model-0000i-of-0000N.safetensors shards plus
  // model.safetensors.index.json; 5 GB (decimal) is transformers' default.
  uint64_t max_shard_bytes = 5'000'000'000ull;
  // An existing config.json in the output directory is replaced only when llamatrain wrote it
  // (its "llamatrain_version" key) for a model of the same shape; otherwise the export is
  // refused before anything is written, unless `overwrite`.
  bool overwrite = false;
};
// Writes the Hugging Face layout (hf_model.h). `path` is a directory (created if needed; stale
// weight files of an earlier export there are removed), or a file ending in ".safetensors": then
// all tensors go to that one file and config.json (and tokenizer.model) beside it. Each file is
// published atomically, the shards before the index that names them.
void save_model_hf(const std::string& path, const ModelData& model, const HfExportOptions& opt = {});

}  // namespace lt
