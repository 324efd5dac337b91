#include "llamatrain/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/loader.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/progress.h"
#include "llamatrain/runtime.h"

namespace lt {

void ModelOverrides::apply(Llama2Config& c) const {
  if (dim > 0) c.dim = dim;
  if (hidden_dim > 0) c.hidden_dim = hidden_dim;
  if (n_layers > 0) c.n_layers = n_layers;
  if (n_heads > 0) c.n_heads = n_heads;
  if (n_kv_heads > 0) c.n_kv_heads = n_kv_heads;
  if (vocab_size > 0) c.vocab_size = vocab_size;
  if (max_seq_len > 0) c.max_seq_len = max_seq_len;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path) {
    if (path.empty()) return;
    const auto slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
    out_.open(path, std::ios::out | std::ios::trunc);
    if (!out_) fail(strcat(path, ": cannot open for writing (--metrics)"));
  }
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << '\n';
    out_.flush();  // each line is complete on disk for live plots and after a crash
  }

 private:
  std::ofstream out_;
};

std::string format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

double evaluate_split(Llama2Model& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens) {
  double loss_sum = 0;
  int64_t tokens = 0;
  MicroBatch mb;
  std::vector<int64_t> rows;
  for (int64_t r0 = 0; r0 < split.n_seq; r0 += batch_size) {
    rows.clear();
    for (int64_t r = r0; r < std::min<int64_t>(split.n_seq, r0 + batch_size); ++r) rows.push_back(r);
    mb.fill(split, rows);
    loss_sum += model.forward(mb.batch());
    tokens += mb.loss_tokens;
  }
  if (loss_tokens) *loss_tokens = tokens;
  return loss_sum;
}

void check_data_fits_model(const Dataset& ds, const Llama2Config& cfg, const std::string& model_tokenizer,
                           const std::string& model_origin) {
  if (ds.info.vocab_size > cfg.vocab_size)
    fail(strcat(ds.path, ": the dataset's vocabulary (", ds.info.vocab_size,
                " tokens) does not fit the model's vocab_size ", cfg.vocab_size, " (", model_origin, ")"));
  if (ds.info.seq_len > cfg.max_seq_len)
    fail(strcat(ds.path, ": seq_len ", ds.info.seq_len, " exceeds the model's max_seq_len ", cfg.max_seq_len,
                " (", model_origin, ")"));
  if (!model_tokenizer.empty() && !ds.info.tokenizer_sha256.empty() &&
      sha256_hex(model_tokenizer) != ds.info.tokenizer_sha256)
    fail(strcat(ds.path, ": tokenized with another tokenizer (sha256 ", ds.info.tokenizer_sha256.substr(0, 12),
                "…) than the one stored in ", model_origin, " (sha256 ", sha256_hex(model_tokenizer).substr(0, 12),
                "…); prepare the data with the model's tokenizer"));
}

TrainResult run_training(const TrainOptions& opt) {
  if (world().size > 1)
    fail(strcat("train: ", world().size, " ranks were launched, but data-parallel training is not "
                "built yet; run one process"));
  if (opt.data.empty()) fail("train: --data DATA.h5 is required");
  if (opt.batch_size <= 0) fail(strcat("train: --batch-size ", opt.batch_size, ", expected > 0"));
  if (opt.grad_accum <= 0) fail(strcat("train: --grad-accum ", opt.grad_accum, ", expected > 0"));
  if (opt.epochs <= 0 && opt.max_steps <= 0) fail("train: need --epochs > 0 or --max-steps > 0");
  if (!(opt.lr > 0)) fail(strcat("train: --lr ", opt.lr, ", expected > 0"));

  const Dataset ds = Dataset::load(opt.data);

  // The model: a checkpointed one to fine-tune, or a preset with overrides, randomly initialised.
  ModelData init;
  Llama2Config cfg;
  if (!opt.init_from.empty()) {
    init = load_model(opt.init_from);
    cfg = init.config;
  } else {
    cfg = preset_config(opt.model_config);
    opt.overrides.apply(cfg);
    cfg.validate();
  }
  check_data_fits_model(ds, cfg, init.tokenizer_model,
                        opt.init_from.empty() ? strcat("--model-config ", opt.model_config) : opt.init_from);

  Llama2Model model(cfg);
  if (!opt.init_from.empty()) model.params() = std::move(init.params);
  else model.init_random(opt.seed);
  model.allocate_grads();

  const int64_t global_batch = int64_t(opt.batch_size) * opt.grad_accum;
  const int64_t steps_per_epoch = ds.train.n_seq / global_batch;
  if (steps_per_epoch == 0)
    fail(strcat(opt.data, ": ", ds.train.n_seq, " training sequences, fewer than one optimizer step (",
                "--batch-size ", opt.batch_size, " x --grad-accum ", opt.grad_accum, " = ", global_batch, ")"));
  const int64_t total_steps = opt.max_steps > 0 ? opt.max_steps : steps_per_epoch * opt.epochs;
  const int64_t n_epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  const int T = ds.info.seq_len;

  LrSchedule sched{opt.lr, opt.min_lr, opt.warmup_steps, total_steps};
  AdamW adamw(model.layout(), 0, model.layout().total(), opt.adamw);
  DataOrder order(ds.train.n_seq, opt.seed, opt.shuffle);
  MetricsWriter metrics(opt.metrics);
  if (!opt.output.empty()) make_dirs(opt.output);

  if (!opt.quiet) {
    std::fprintf(stderr,
                 "train: model %s (%.2fM parameters), data %s: %lld train / %lld test sequences of %d tokens\n"
                 "train: %lld steps (%lld per epoch), global batch %lld = %d x %d, threads %d, seed %llu\n",
                 cfg.to_string().c_str(), double(cfg.num_parameters()) / 1e6, opt.data.c_str(),
                 (long long)ds.train.n_seq, (long long)ds.test.n_seq, T, (long long)total_steps,
                 (long long)steps_per_epoch, (long long)global_batch, opt.batch_size, opt.grad_accum,
                 omp_get_max_threads(), (unsigned long long)opt.seed);
  }

  // Models carry the dataset's tokenizer, so eval and generate need no --tokenizer.
  auto save_model = [&](const std::string& path) {
    ModelData out;
    out.config = cfg;
    out.params = model.params();
    out.tokenizer_model = ds.tokenizer_model;
    save_model_hdf5(path, out);
    if (!opt.quiet) std::fprintf(stderr, "train: wrote %s\n", path.c_str());
  };
  if (opt.save_init) {
    if (opt.output.empty()) fail("train: --save-init needs --output DIR");
    save_model(opt.output + "/init.h5");
  }

  TrainResult result;
  const auto t_start = Clock::now();
  MicroBatch mb;
  std::vector<int64_t> rows;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < n_epochs && step < total_steps; ++epoch) {
    const auto t_epoch = Clock::now();
    const int64_t epoch_steps = std::min(steps_per_epoch, total_steps - step);
    // One bar per epoch ("epoch 2/3 [###..] 40% 12/30 steps ... eta"); the extra text carries the
    // loss, the throughput and, for multi-epoch runs, the ETA of the whole run.
    Progress progress(strcat("epoch ", epoch + 1, "/", n_epochs), epoch_steps, "steps",
                      opt.progress ? 0.0 : 1e30);
    double epoch_loss = 0;
    int64_t epoch_tokens = 0;
    for (int64_t s = 0; s < steps_per_epoch && step < total_steps; ++s, ++step) {
      const auto t_step = Clock::now();
      model.zero_grads();
      // Loss tokens of the whole step first, so every micro-batch is scaled by 1/global count
      // and the update is the same for any split of the step into micro-batches.
      int64_t step_tokens = 0;
      for (int64_t i = 0; i < global_batch; ++i) {
        const uint8_t* m = ds.train.row_mask(order.row(epoch, s * global_batch + i));
        for (int t = 1; t <= T; ++t) step_tokens += m[t];
      }
      const float dloss = step_tokens > 0 ? 1.0f / float(step_tokens) : 0.0f;
      double loss_sum = 0;
      for (int a = 0; a < opt.grad_accum; ++a) {
        rows.clear();
        for (int b = 0; b < opt.batch_size; ++b)
          rows.push_back(order.row(epoch, s * global_batch + int64_t(a) * opt.batch_size + b));
        mb.fill(ds.train, rows);
        loss_sum += model.forward(mb.batch());
        model.backward(mb.batch(), dloss);
      }
      const double grad_norm = clip_grad_norm(model.grads().data(), model.grads().size(), opt.grad_clip);
      const float lr = sched.at(step);
      adamw.step(model.params().data(), model.grads().data(), lr, step + 1);

      const double step_s = seconds_since(t_step);
      const double loss = step_tokens > 0 ? loss_sum / double(step_tokens) : 0.0;
      if (!std::isfinite(loss) || !std::isfinite(grad_norm))
        fail(strcat("train: loss or gradient norm became non-finite at step ", step + 1,
                    " (loss ", loss, ", grad_norm ", grad_norm, "); try a lower --lr"));
      if (step == 0) result.first_loss = loss;
      result.last_loss = loss;
      epoch_loss += loss_sum;
      epoch_tokens += step_tokens;
      const int64_t tokens = global_batch * T;
      metrics.write({{"type", "step"}, {"step", step + 1}, {"epoch", epoch}, {"loss", loss},
                     {"lr", lr}, {"grad_norm", grad_norm}, {"tokens", tokens},
                     {"loss_tokens", step_tokens}, {"step_ms", step_s * 1e3},
                     {"tokens_per_s", double(tokens) / step_s}});
      const double elapsed = seconds_since(t_start);
      char extra[160];
      std::snprintf(extra, sizeof extra, "loss %.4f %.0f tok/s", loss, double(tokens) / step_s);
      std::string line = extra;
      if (n_epochs > 1)
        line += " run eta " + format_eta(elapsed / double(step + 1) * double(total_steps - step - 1));
      progress.update(s + 1, line);
    }
    const double epoch_s = seconds_since(t_epoch);
    int64_t test_tokens = 0;
    const double test_sum = ds.test.n_seq > 0 ? evaluate_split(model, ds.test, opt.batch_size, &test_tokens) : 0.0;
    const double test_loss = test_tokens > 0 ? test_sum / double(test_tokens) : NAN;
    result.test_loss = std::isfinite(test_loss) ? test_loss : -1;
    nlohmann::json ej = {{"type", "epoch"}, {"epoch", epoch}, {"step", step},
                         {"epoch_time_s", epoch_s},
                         {"train_loss", epoch_tokens ? epoch_loss / double(epoch_tokens) : 0.0}};
    ej["test_loss"] = std::isfinite(test_loss) ? nlohmann::json(test_loss) : nlohmann::json(nullptr);
    metrics.write(ej);
    progress.finish();
    if (!opt.quiet) {
      std::fprintf(stderr, "train: epoch %lld done in %.1f s, train loss %.4f, test loss %s\n",
                   (long long)epoch + 1, epoch_s, epoch_tokens ? epoch_loss / double(epoch_tokens) : 0.0,
                   std::isfinite(test_loss) ? strcat(test_loss).c_str() : "n/a (no test split)");
    }
  }
  result.steps = step;
  result.seconds = seconds_since(t_start);

  if (!opt.output.empty()) {
    result.model_path = opt.output + "/model.h5";
    save_model(result.model_path);
  }
  return result;
}

}  // namespace lt
