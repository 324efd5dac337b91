// Attribute sets that several of our HDF5 files share, each written and read by one function, so
// that a model file and a checkpoint describe a model and a training run in the same words.
//
// The conventions of every attribute llamatrain writes (docs/formats.md, "Attributes"):
//   numbers    scalar int64 or float64; a float setting (norm_eps, lr) as the decimal it was
//              written as (h5::File::write_attr(float): 1e-5, not 9.99999974737875e-06)
//   flags      int64 0 or 1
//   text       scalar variable-length UTF-8 strings
//   lists      1-D attributes of int64 or of strings
// and never a number inside a string. Readers also accept the older forms (fixed-length strings,
// float32 numbers).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "llamatrain/config.h"
#include "llamatrain/h5.h"

namespace lt {

// dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len (int64), norm_eps,
// rope_theta (float64), tied_embeddings (0/1) on `obj`.
void write_model_config_attrs(h5::File& f, const std::string& obj, const Llama2Config& c);
bool has_model_config_attrs(const h5::File& f, const std::string& obj);
// Throws lt::Error naming the file and the attribute that is missing or wrong; validates.
Llama2Config read_model_config_attrs(const h5::File& f, const std::string& obj);

// How a model was trained: the attributes of the /training group of model.h5 and of every
// checkpoint.h5, written by `train`.
struct TrainingRecord {
  std::string tool_version;      // llamatrain's version
  std::string command_line;      // as typed (arguments with spaces quoted); "" when unknown
  std::string data_path;         // the dataset file, absolute
  std::string data_source_sha256;    // the dataset's source_sha256 attribute
  std::string data_tokenizer_sha256; // the dataset's tokenizer_sha256 attribute
  std::string data_identity;     // dataset_identity(): what resume compares
  int64_t steps = 0;             // optimizer steps done when written
  int64_t total_steps = 0;       // steps the run makes
  int64_t epochs = 0;            // passes over the data the run makes (the last may be partial)
  int64_t global_batch = 0;      // sequences per optimizer step
  int64_t batch_size = 0;        // sequences per micro-batch
  std::string lr_schedule = "linear warm-up, then cosine decay to min_lr";
  float lr = 0, min_lr = 0;
  int64_t warmup_steps = 0;
  float weight_decay = 0, beta1 = 0, beta2 = 0, grad_clip = 0;
  uint64_t seed = 0;
  int64_t world_size = 1;
  int64_t zero_stage = 0;
  std::string recompute, balance;
  bool shuffle = true;
  double train_loss = NAN;       // mean loss per token of the last step (NaN: not written)
  double eval_loss = NAN;        // the latest test-split loss (NaN: none, not written)
  double unix_time_s = 0;        // when written, seconds since 1970 (UTC)
};
void write_training_record(h5::File& f, const std::string& group, const TrainingRecord& r);
bool has_training_record(const h5::File& f, const std::string& group);
TrainingRecord read_training_record(const h5::File& f, const std::string& group);

}  // namespace lt
