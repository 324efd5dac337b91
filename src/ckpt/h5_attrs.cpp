// The model-config and training-record attribute sets of h5_attrs.h.
#include "llamatrain/h5_attrs.h"

#include "llamatrain/error.h"

namespace lt {

void write_model_config_attrs(h5::File& f, const std::string& obj, const Llama2Config& c) {
  f.write_attr(obj, "dim", int64_t(c.dim));
  f.write_attr(obj, "hidden_dim", int64_t(c.hidden_dim));
  f.write_attr(obj, "n_layers", int64_t(c.n_layers));
  f.write_attr(obj, "n_heads", int64_t(c.n_heads));
  f.write_attr(obj, "n_kv_heads", int64_t(c.n_kv_heads));
  f.write_attr(obj, "vocab_size", int64_t(c.vocab_size));
  f.write_attr(obj, "max_seq_len", int64_t(c.max_seq_len));
  f.write_attr(obj, "norm_eps", c.norm_eps);      // float: stored as the decimal written
  f.write_attr(obj, "rope_theta", c.rope_theta);
  f.write_attr(obj, "tied_embeddings", int64_t(c.tied_embeddings ? 1 : 0));
}

bool has_model_config_attrs(const h5::File& f, const std::string& obj) { return f.has_attr(obj, "dim"); }

Llama2Config read_model_config_attrs(const h5::File& f, const std::string& obj) {
  Llama2Config c;
  c.dim = int(f.read_attr_int(obj, "dim"));
  c.hidden_dim = int(f.read_attr_int(obj, "hidden_dim"));
  c.n_layers = int(f.read_attr_int(obj, "n_layers"));
  c.n_heads = int(f.read_attr_int(obj, "n_heads"));
  c.n_kv_heads = int(f.read_attr_int(obj, "n_kv_heads"));
  c.vocab_size = int(f.read_attr_int(obj, "vocab_size"));
  c.max_seq_len = int(f.read_attr_int(obj, "max_seq_len"));
  // float64 (or float32 in files written before the decimal convention) to the float in memory.
  c.norm_eps = float(f.read_attr_double(obj, "norm_eps"));
  c.rope_theta = float(f.read_attr_double(obj, "rope_theta"));
  c.tied_embeddings = f.read_attr_int(obj, "tied_embeddings") != 0;
  try {
    c.validate();
  } catch (const Error& e) {
    fail(strcat(f.path(), ": ", e.what()));
  }
  return c;
}

void write_training_record(h5::File& f, const std::string& group, const TrainingRecord& r) {
  f.create_group(group);
  f.write_attr(group, "tool_version", r.tool_version);
  f.write_attr(group, "command_line", r.command_line);
  f.write_attr(group, "data_path", r.data_path);
  f.write_attr(group, "data_source_sha256", r.data_source_sha256);
  f.write_attr(group, "data_tokenizer_sha256", r.data_tokenizer_sha256);
  f.write_attr(group, "data_identity", r.data_identity);
  f.write_attr(group, "steps", r.steps);
  f.write_attr(group, "total_steps", r.total_steps);
  f.write_attr(group, "epochs", r.epochs);
  f.write_attr(group, "global_batch", r.global_batch);
  f.write_attr(group, "batch_size", r.batch_size);
  f.write_attr(group, "lr_schedule", r.lr_schedule);
  f.write_attr(group, "lr", r.lr);
  f.write_attr(group, "min_lr", r.min_lr);
  f.write_attr(group, "warmup_steps", r.warmup_steps);
  f.write_attr(group, "weight_decay", r.weight_decay);
  f.write_attr(group, "beta1", r.beta1);
  f.write_attr(group, "beta2", r.beta2);
  f.write_attr(group, "grad_clip", r.grad_clip);
  // Signed 64-bit like every integer attribute: a seed above 2^63 is stored as its bit pattern.
  f.write_attr(group, "seed", int64_t(r.seed));
  f.write_attr(group, "world_size", r.world_size);
  f.write_attr(group, "zero_stage", r.zero_stage);
  f.write_attr(group, "recompute", r.recompute);
  f.write_attr(group, "balance", r.balance);
  f.write_attr(group, "shuffle", int64_t(r.shuffle ? 1 : 0));
  if (std::isfinite(r.train_loss)) f.write_attr(group, "train_loss", r.train_loss);
  if (std::isfinite(r.eval_loss)) f.write_attr(group, "eval_loss", r.eval_loss);
  f.write_attr(group, "unix_time_s", r.unix_time_s);
}

bool has_training_record(const h5::File& f, const std::string& group) {
  return f.exists(group) && f.has_attr(group, "steps");
}

TrainingRecord read_training_record(const h5::File& f, const std::string& group) {
  TrainingRecord r;
  auto str = [&](const char* name) { return f.read_attr_string(group, name); };
  auto num = [&](const char* name) { return f.read_attr_int(group, name); };
  auto real = [&](const char* name) { return f.read_attr_double(group, name); };
  r.tool_version = str("tool_version");
  r.command_line = str("command_line");
  r.data_path = str("data_path");
  r.data_source_sha256 = str("data_source_sha256");
  r.data_tokenizer_sha256 = str("data_tokenizer_sha256");
  r.data_identity = str("data_identity");
  r.steps = num("steps");
  r.total_steps = num("total_steps");
  r.epochs = num("epochs");
  r.global_batch = num("global_batch");
  r.batch_size = num("batch_size");
  r.lr_schedule = str("lr_schedule");
  r.lr = float(real("lr"));
  r.min_lr = float(real("min_lr"));
  r.warmup_steps = num("warmup_steps");
  r.weight_decay = float(real("weight_decay"));
  r.beta1 = float(real("beta1"));
  r.beta2 = float(real("beta2"));
  r.grad_clip = float(real("grad_clip"));
  r.seed = uint64_t(num("seed"));
  r.world_size = num("world_size");
  r.zero_stage = num("zero_stage");
  r.recompute = str("recompute");
  r.balance = str("balance");
  r.shuffle = num("shuffle") != 0;
  if (f.has_attr(group, "train_loss")) r.train_loss = real("train_loss");
  if (f.has_attr(group, "eval_loss")) r.eval_loss = real("eval_loss");
  r.unix_time_s = real("unix_time_s");
  return r;
}

}  // namespace lt
