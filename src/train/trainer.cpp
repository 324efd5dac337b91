#include "llamatrain/trainer.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llamatrain/balance.h"
#include "llamatrain/checkpoint.h"
#include "llamatrain/comm.h"
#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/loader.h"
#include "llamatrain/device.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/progress.h"
#include "llamatrain/runtime.h"
#include "llamatrain/zero.h"

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
  void open(const std::string& path, bool append) {
    if (path.empty()) return;
    const auto slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
    out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
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

// The start-of-run device table, ranks grouped by node:
//   node  rank  device  SMs  memory  cc  GEMM TFLOP/s
std::string format_device_table(const std::vector<std::string>& hosts, const std::vector<std::string>& devices,
                                const std::vector<double>& nums /*(ranks, 5)*/, const std::string& gemm_what) {
  std::vector<int> order(hosts.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = int(r);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return hosts[size_t(a)] < hosts[size_t(b)]; });
  std::string out = strcat("devices (GEMM rate measured at start: ", gemm_what, " on rank 0)\n");
  char line[512];
  std::snprintf(line, sizeof line, "  %-16s %5s  %-48s %4s %10s %5s %12s\n", "node", "rank", "device", "SMs", "memory",
                "cc", "GEMM TFLOP/s");
  out += line;
  std::string last;
  for (int r : order) {
    const double* d = nums.data() + size_t(r) * 5;
    const std::string host = hosts[size_t(r)] == last ? "" : hosts[size_t(r)];
    last = hosts[size_t(r)];
    std::snprintf(line, sizeof line, "  %-16s %5d  %-48s %4d %6.1f GiB %2d.%-2d %12.3f\n", host.c_str(), r,
                  devices[size_t(r)].substr(0, 48).c_str(), int(d[0]), d[1] / double(1ull << 30), int(d[2]), int(d[3]),
                  d[4]);
    out += line;
  }
  return out;
}

std::string format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

namespace {

// Masked loss sum of a split, its micro-batches dealt round-robin over the ranks; forward is the
// model's forward on whichever device runs it.
template <class Forward>
double evaluate_split_with(Forward&& forward, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                           Comm& comm) {
  double sums[2] = {0, 0};  // loss, loss tokens
  MicroBatch mb;
  std::vector<int64_t> rows;
  const int64_t n_batches = (split.n_seq + batch_size - 1) / batch_size;
  for (int64_t j = comm.rank(); j < n_batches; j += comm.size()) {
    rows.clear();
    for (int64_t r = j * batch_size; r < std::min<int64_t>(split.n_seq, (j + 1) * batch_size); ++r) rows.push_back(r);
    mb.fill(split, rows);
    sums[0] += forward(mb.batch());
    sums[1] += double(mb.loss_tokens);
  }
  comm.allreduce_sum(sums, 2);
  if (loss_tokens) *loss_tokens = int64_t(sums[1]);
  return sums[0];
}

}  // namespace

double evaluate_split(Llama2Model& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                      Comm& comm) {
  return evaluate_split_with([&](const Batch& b) { return model.forward(b); }, split, batch_size, loss_tokens, comm);
}

double evaluate_split(Llama2Model& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens) {
  return evaluate_split(model, split, batch_size, loss_tokens, *make_self_comm());
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

namespace {

// SIGTERM (Slurm's time limit, scancel) and SIGUSR1 (a pre-emption warning with --signal): set a
// flag; the training loop checkpoints at the end of the step and stops.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// What the ranks measured in one step, gathered so every rank takes the same decisions.
struct StepTimes {
  std::vector<double> compute, wait;  // seconds per rank
  int slowest = 0;
  double balance = 1;  // mean compute / max compute (1 = every rank busy the whole step)
};

// Every step's one small collective: the timings, each rank's checkpoint writer state and whether
// a stop signal arrived anywhere.
StepTimes gather_step_times(Comm& comm, double compute_s, double step_s, int writer_state, int signal,
                            std::vector<int>* writer_states, bool* stop) {
  const std::vector<double> all = comm.allgather_values({compute_s, step_s, double(writer_state), double(signal)});
  StepTimes t;
  double sum = 0, worst = 0;
  writer_states->clear();
  *stop = false;
  for (int r = 0; r < comm.size(); ++r) {
    t.compute.push_back(all[size_t(4 * r)]);
    t.wait.push_back(std::max(0.0, all[size_t(4 * r + 1)] - all[size_t(4 * r)]));
    writer_states->push_back(int(all[size_t(4 * r + 2)]));
    if (all[size_t(4 * r + 3)] != 0) *stop = true;
    sum += t.compute.back();
    if (t.compute.back() > worst) worst = t.compute.back(), t.slowest = r;
  }
  t.balance = worst > 0 ? sum / comm.size() / worst : 1.0;
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

TrainResult run_training(const TrainOptions& opt) {
  Comm& comm = world_comm();
  const int W = comm.size(), rank = comm.rank();
  const bool rank0 = rank == 0;
  const bool say = rank0 && !opt.quiet;
  // With checkpoints, a stop signal is only recorded, from the start: one that arrives while the
  // data and model load is acted on after the first step (a checkpoint, then exit 3) instead of
  // killing the rank before its handler exists.
  if (!opt.checkpoint_dir.empty()) {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
  }

  // Everything that can be wrong with the options or the inputs is found by every rank alike;
  // agree() makes sure a rank that fails alone does not leave the others waiting.
  Dataset ds;
  ModelData init;
  Llama2Config cfg;
  BalanceMode balance = BalanceMode::kOff;
  Recompute recompute = Recompute::kNone;
  DeviceKind device = DeviceKind::cpu;
  std::vector<double> weights(size_t(W), 1.0);
  Slowdown slowdown;
  int64_t global_batch = 0, micro_batches = 0;
  agree(comm, [&] {
    if (opt.data.empty()) fail("train: --data DATA.h5 is required");
    if (opt.batch_size <= 0) fail(strcat("train: --batch-size ", opt.batch_size, ", expected > 0"));
    if (opt.grad_accum <= 0) fail(strcat("train: --grad-accum ", opt.grad_accum, ", expected > 0"));
    if (opt.epochs <= 0 && opt.max_steps <= 0) fail("train: need --epochs > 0 or --max-steps > 0");
    if (!(opt.lr > 0)) fail(strcat("train: --lr ", opt.lr, ", expected > 0"));
    if (opt.zero_stage < 0 || opt.zero_stage > 2) fail(strcat("train: --zero ", opt.zero_stage, ", expected 0, 1 or 2"));
    recompute = parse_recompute(opt.recompute);
    balance = parse_balance_mode(opt.balance);
    if (!opt.rank_weights.empty()) {
      if (balance == BalanceMode::kOff) fail("train: --rank-weights needs --balance static or auto");
      weights = parse_rank_weights(opt.rank_weights, W);
    } else if (balance == BalanceMode::kStatic) {
      fail("train: --balance static needs --rank-weights w0,w1,... (one per rank)");
    }
    if (opt.rebalance_every <= 0) fail(strcat("train: --rebalance-every ", opt.rebalance_every, ", expected > 0"));
    if (!opt.simulate_slowdown.empty()) slowdown = parse_slowdown(opt.simulate_slowdown, W);
    global_batch = opt.global_batch > 0 ? opt.global_batch : int64_t(opt.batch_size) * opt.grad_accum * W;
    if (global_batch % opt.batch_size != 0)
      fail(strcat("train: --global-batch ", global_batch, " is not a multiple of --batch-size ", opt.batch_size,
                  " (every rank runs whole micro-batches of one shape)"));
    micro_batches = global_batch / opt.batch_size;
    if (balance == BalanceMode::kAuto && micro_batches < W)
      fail(strcat("train: --balance auto needs at least one micro-batch per rank, but the global batch of ",
                  global_batch, " is ", micro_batches, " micro-batches of ", opt.batch_size, " for ", W, " ranks"));

    device = resolve_device(opt.device);
    if (opt.attention != "native" && device != DeviceKind::cuda)
      fail(strcat("train: --attention ", opt.attention, " runs only on a GPU (cuDNN), but this run uses --device ",
                  device_name(device), "; use --attention native"));
    ds = Dataset::load(opt.data);
    // The model: a checkpointed one to fine-tune, or a preset with overrides, randomly initialised.
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
    if (ds.train.n_seq < global_batch)
      fail(strcat(opt.data, ": ", ds.train.n_seq, " training sequences, fewer than one optimizer step (global batch ",
                  global_batch, " = ", micro_batches, " micro-batches of ", opt.batch_size, ")"));
    if (rank0 && !opt.output.empty()) make_dirs(opt.output);
  });

  Llama2Model model(cfg);
  model.set_recompute(recompute);
  ZeroOptimizer zero(comm, model.layout(), opt.zero_stage, opt.adamw);
  const size_t n_params = model.layout().total();
  if (!opt.init_from.empty()) model.params() = std::move(init.params);
  else model.init_random(opt.seed);
  // Padded to a multiple of the world size for the sharded collectives; the padding stays 0.
  model.params().resize(zero.padded_size(), 0.f);
  // Every rank starts from rank 0's weights, whatever the initialisation did elsewhere.
  comm.broadcast(model.params().data(), n_params * sizeof(float), 0);
  // Off the CPU the device model runs forward, backward and the optimizer (DeviceModel::zero_*:
  // the ZeRO collectives on device buffers, the gradient reduction overlapped with backward). The
  // host keeps model.params() and zero's Adam arrays only as the staging area of checkpoints and
  // of the final model, and no gradient buffer.
  std::unique_ptr<DeviceModel> dev;
  if (device == DeviceKind::cpu) {
    model.allocate_grads();
    model.grads().resize(zero.padded_size(), 0.f);
  } else {
    dev = make_device_model(device, cfg, world().local_rank);
    dev->set_attention(opt.attention);
    dev->set_recompute(recompute);
    if (rank0 && !opt.quiet)
      std::fprintf(stderr, "train: device %s: %s\n", device_name(device), dev->description().c_str());
  }
  // Every rank's device and its measured matrix-product rate: a table by node at start, the
  // per-rank MFU of every step, and on GPUs the balancer's starting weights (auto without
  // --rank-weights), so A100 and H100 ranks start near their right share.
  const DeviceInfo my_device = dev ? dev->info() : cpu_device_info(omp_get_max_threads());
  const std::vector<std::string> rank_hosts = comm.allgather_strings(world().host);
  const std::vector<std::string> rank_devices = comm.allgather_strings(my_device.name);
  const std::vector<double> rank_device_nums =
      comm.allgather_values({double(my_device.sm_count), my_device.memory_bytes, double(my_device.cc_major),
                             double(my_device.cc_minor), my_device.gemm_tflops});
  std::vector<double> rank_tflops(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) rank_tflops[size_t(r)] = rank_device_nums[size_t(r) * 5 + 4];
  if (device == DeviceKind::cuda && balance == BalanceMode::kAuto && opt.rank_weights.empty()) weights = rank_tflops;

  const int64_t steps_per_epoch = ds.train.n_seq / global_batch;
  const int64_t total_steps = opt.max_steps > 0 ? opt.max_steps : steps_per_epoch * opt.epochs;
  const int64_t n_epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  const int T = ds.info.seq_len;
  const int b = opt.batch_size;

  std::vector<int> split = split_by_weights(int(micro_batches), weights, balance == BalanceMode::kAuto ? 1 : 0);
  LrSchedule sched{opt.lr, opt.min_lr, opt.warmup_steps, total_steps};
  DataOrder order(ds.train.n_seq, opt.seed, opt.shuffle);

  // ---- resume: the newest checkpoint that loads on every rank -------------------------------
  TrainResult result;
  int64_t step = 0;
  const std::string tokenizer_sha = ds.tokenizer_model.empty() ? std::string() : sha256_hex(ds.tokenizer_model);
  const std::string data_id = dataset_identity(ds);
  AdamW& adam = zero.adamw();
  if (opt.resume.empty()) throw CollectiveError("train: --resume needs auto, none or a checkpoint directory");
  {
    const bool explicit_path = opt.resume != "auto" && opt.resume != "none";
    std::vector<std::string> candidates;
    if (explicit_path) candidates = {opt.resume};
    else if (opt.resume == "auto" && !opt.checkpoint_dir.empty()) candidates = list_checkpoints(opt.checkpoint_dir);
    int damaged = 0;
    for (const std::string& cand : candidates) {
      // 0 loaded, 1 damaged (try the previous one), 2 refused (stop: the run does not match).
      int kind = 0;
      std::string msg;
      CheckpointInfo ci;
      try {
        ci = read_checkpoint_info(cand);
      } catch (const Error& e) {
        kind = 1, msg = e.what();
      }
      if (kind == 0) {
        if (ci.model_config != cfg.to_string())
          kind = 2, msg = strcat(cand, ": a checkpoint of another model (", ci.model_config, "); this run trains ",
                                 cfg.to_string());
        else if (ci.tokenizer_sha256 != tokenizer_sha)
          kind = 2, msg = strcat(cand, ": written with another tokenizer (sha256 ", ci.tokenizer_sha256.substr(0, 12),
                                 "…) than the dataset's (", tokenizer_sha.substr(0, 12), "…)");
        else if (ci.data_identity != data_id && !opt.allow_new_data)
          kind = 2, msg = strcat(cand, ": written while training on other data (", ci.data_identity, "); this run has ",
                                 data_id, ". Pass --allow-new-data to continue on the new data");
        else if (ci.global_batch != global_batch)
          kind = 2, msg = strcat(cand, ": written with a global batch of ", ci.global_batch, " sequences; this run has ",
                                 global_batch, " (the data cursor counts steps of that size)");
      }
      if (kind == 0) {
        try {
          load_checkpoint_state(cand, model.layout(), model.params().data(), adam.begin(), adam.end(),
                                adam.m().data(), adam.v().data());
        } catch (const Error& e) {
          kind = 1, msg = e.what();
        }
      }
      int worst = 0;
      for (double k : comm.allgather_values({double(kind)})) worst = std::max(worst, int(k));
      if (worst == 2) agree_on_error(comm, kind == 2 ? &msg : nullptr);
      if (worst == 1) {
        std::string why;
        try {
          agree_on_error(comm, kind == 1 ? &msg : nullptr);
        } catch (const CollectiveError& e) {
          why = e.what();
        }
        if (explicit_path) throw CollectiveError(strcat("train: --resume ", cand, ": ", why));
        ++damaged;
        if (say) std::fprintf(stderr, "train: warning: skipping damaged checkpoint %s: %s\n", cand.c_str(), why.c_str());
        continue;
      }
      step = ci.step;
      result.start_step = step;
      result.resumed_from = cand;
      int sum = 0;
      for (int k : ci.split) sum += k;
      if (ci.world_size == W && int(ci.split.size()) == W && sum == micro_batches) split = ci.split;
      if (say)
        std::fprintf(stderr, "train: resumed from %s at step %lld (written by %d rank(s) with ZeRO stage %d)\n",
                     cand.c_str(), (long long)step, ci.world_size, ci.zero_stage);
      break;
    }
    if (result.resumed_from.empty() && damaged > 0)
      throw CollectiveError(strcat("train: no usable checkpoint in ", opt.checkpoint_dir, ": all ", damaged,
                                   " are damaged (see above); move them away to start afresh"));
    if (step >= total_steps)
      throw CollectiveError(strcat("train: ", result.resumed_from, " is at step ", step, ", the run has ", total_steps,
                                   " steps: nothing left to do (raise --epochs or --max-steps to continue)"));
  }

  // ---- the checkpoint writer ---------------------------------------------------------------
  std::unique_ptr<CheckpointWriter> writer;
  std::vector<size_t> shard_b, shard_e;
  for (int r = 0; r < W; ++r) shard_b.push_back(zero.shards().begin(r)), shard_e.push_back(zero.shards().end(r));
  if (!opt.checkpoint_dir.empty()) {
    agree(comm, [&] {
      if (!rank0) return;
      make_dirs(opt.checkpoint_dir);
      // Partial checkpoints of a run that died while writing.
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(opt.checkpoint_dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(".step-", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
          std::filesystem::remove_all(e.path(), ec);
      }
    });
    writer = std::make_unique<CheckpointWriter>(opt.checkpoint_dir, rank, W, opt.keep_last);
  }
  MetricsWriter metrics;
  if (rank0) metrics.open(opt.metrics, step > 0);

  // Activations live where forward/backward run: the device model's buffers when there is one.
  const size_t act_bytes = dev ? dev->activation_bytes(b, T) : model.activation_bytes(b, T);
  const auto mem = memory_table(n_params, W, opt.zero_stage, double(act_bytes));
  if (say) {
    std::fprintf(stderr,
                 "train: model %s (%.2fM parameters), data %s: %lld train / %lld test sequences of %d tokens\n"
                 "train: %lld steps (%lld per epoch), global batch %lld = %lld micro-batches of %d, %d rank(s), "
                 "ZeRO stage %d, recompute %s, balance %s, split [%s], threads %d per rank, seed %llu\n",
                 cfg.to_string().c_str(), double(cfg.num_parameters()) / 1e6, opt.data.c_str(),
                 (long long)ds.train.n_seq, (long long)ds.test.n_seq, T, (long long)total_steps,
                 (long long)steps_per_epoch, (long long)global_batch, (long long)micro_batches, b, W, opt.zero_stage,
                 recompute_name(recompute), balance_mode_name(balance), join(split).c_str(), omp_get_max_threads(),
                 (unsigned long long)opt.seed);
    if (slowdown.rank >= 0)
      std::fprintf(stderr, "train: SIMULATED slowdown: rank %d computes %.2fx slower (it busy-waits the difference)\n",
                   slowdown.rank, slowdown.factor);
    std::fprintf(stderr, "%s", format_memory_table(mem, opt.zero_stage).c_str());
    std::fprintf(stderr, "%s", format_device_table(rank_hosts, rank_devices, rank_device_nums,
                                                   my_device.gemm_what).c_str());
  }
  {
    nlohmann::json rows = nlohmann::json::array();
    for (int r = 0; r < W; ++r) {
      const double* d = rank_device_nums.data() + size_t(r) * 5;
      rows.push_back({{"rank", r}, {"host", rank_hosts[size_t(r)]}, {"device", rank_devices[size_t(r)]},
                      {"sm_count", int(d[0])}, {"memory_bytes", d[1]}, {"compute_capability", strcat(int(d[2]), ".", int(d[3]))},
                      {"gemm_tflops", d[4]}});
    }
    metrics.write({{"type", "devices"}, {"device", device_name(device)}, {"gemm", my_device.gemm_what}, {"ranks", rows}});
  }
  {
    nlohmann::json rows = nlohmann::json::array();
    for (const MemoryRow& m : mem)
      rows.push_back({{"rank", m.rank}, {"params_bytes", m.params}, {"grads_bytes", m.grads},
                      {"optimizer_bytes", m.optimizer}, {"activation_bytes", m.activations}, {"total_bytes", m.total()}});
    metrics.write({{"type", "memory"}, {"world_size", W}, {"zero_stage", opt.zero_stage}, {"n_params", n_params},
                   {"ranks", rows}});
  }

  // Models carry the dataset's tokenizer, so eval and generate need no --tokenizer. Rank 0 writes;
  // the others learn whether it worked.
  auto save_model = [&](const std::string& path) {
    agree(comm, [&] {
      if (!rank0) return;
      ModelData out;
      out.config = cfg;
      out.params.assign(model.params().begin(), model.params().begin() + std::ptrdiff_t(n_params));
      out.tokenizer_model = ds.tokenizer_model;
      save_model_hdf5(path, out);
      if (!opt.quiet) std::fprintf(stderr, "train: wrote %s\n", path.c_str());
    });
  };
  if (opt.save_init) {
    if (opt.output.empty()) throw CollectiveError("train: --save-init needs --output DIR");
    save_model(opt.output + "/init.h5");
  }

  // Once every rank reported on the checkpoint in flight: publish it, or drop it when a rank failed.
  bool said_buffered_io = false;
  auto finish_checkpoint = [&](const std::vector<int>& states, bool sync) {
    bool ok = true;
    for (int st : states) ok = ok && st == CheckpointWriter::kWritten;
    const int64_t ck_step = writer->pending_step();
    if (ok) {
      const double write_s = writer->last_write_seconds();
      const double mib = double(writer->last_bytes()) / (1024.0 * 1024.0);
      const std::string io = writer->last_io();
      writer->publish(shard_b, shard_e, sync);
      if (say && !opt.progress)
        std::fprintf(stderr, "train: checkpoint of step %lld written (%.1f MiB on rank 0 in %.2f s, %s)\n",
                     (long long)ck_step, mib, write_s, io.c_str());
      // Once per run even with the progress bar: a buffered fallback is slower, and the reason
      // (a file system without O_DIRECT, or the variable) is worth seeing.
      if (say && io != "direct" && !said_buffered_io) {
        std::fprintf(stderr, "train: checkpoint arrays written through the page cache: %s\n", io.c_str());
        said_buffered_io = true;
      }
      metrics.write({{"type", "checkpoint"}, {"step", ck_step}, {"rank0_write_s", write_s}, {"rank0_bytes", writer->last_bytes()},
                     {"rank0_copy_s", writer->last_copy_seconds()}, {"rank0_io", io}, {"dir", opt.checkpoint_dir}});
    } else {
      if (writer->state() == CheckpointWriter::kFailed)
        std::fprintf(stderr, "[rank %d/%d %s] train: warning: checkpoint of step %lld failed: %s\n", rank, W,
                     world().host.c_str(), (long long)ck_step, writer->error().c_str());
      writer->abandon();
      if (say) std::fprintf(stderr, "train: warning: checkpoint of step %lld dropped; training goes on\n", (long long)ck_step);
    }
  };
  // Waits for this rank's write and agrees with the others (a collective: every rank calls it).
  auto settle_checkpoint = [&](bool sync) {
    if (!writer || writer->pending_step() < 0) return;
    const int st = writer->wait();
    std::vector<int> states;
    for (double x : comm.allgather_values({double(st)})) states.push_back(int(x));
    finish_checkpoint(states, sync);
  };
  // Snapshot after `steps_done` steps and write in the background.
  auto start_checkpoint = [&](int64_t steps_done) {
    settle_checkpoint(false);
    CheckpointInfo ci;
    ci.step = steps_done;
    ci.epoch = steps_done / steps_per_epoch;
    ci.world_size = W;
    ci.zero_stage = opt.zero_stage;
    ci.seed = opt.seed;
    ci.global_batch = global_batch;
    ci.split = split;
    ci.model_config = cfg.to_string();
    ci.tokenizer_sha256 = tokenizer_sha;
    ci.data_identity = data_id;
    ci.train_config = nlohmann::json({{"data", opt.data}, {"batch_size", b}, {"global_batch", global_batch},
                                      {"zero", opt.zero_stage}, {"recompute", opt.recompute},
                                      {"lr", opt.lr}, {"min_lr", opt.min_lr},
                                      {"warmup_steps", opt.warmup_steps}, {"total_steps", total_steps},
                                      {"weight_decay", opt.adamw.weight_decay}, {"beta1", opt.adamw.beta1},
                                      {"beta2", opt.adamw.beta2}, {"grad_clip", opt.grad_clip},
                                      {"balance", opt.balance}, {"shuffle", opt.shuffle}})
                           .dump();
    if (dev) dev->zero_state_to_host(zero, model.params().data());
    ShardView view;
    view.params = model.params().data();
    view.begin = shard_b[size_t(rank)];
    view.end = shard_e[size_t(rank)];
    view.m = adam.m().data() + (view.begin - adam.begin());
    view.v = adam.v().data() + (view.begin - adam.begin());
    const double snapshot_s = writer->start(ci, model.layout(), view, ds.tokenizer_model);
    metrics.write({{"type", "checkpoint_started"}, {"step", steps_done}, {"snapshot_ms", snapshot_s * 1e3}});
  };

  if (dev) dev->zero_init(zero, model.params().data());  // after a resume, too
  const auto t_start = Clock::now();
  MicroBatch mb;
  std::vector<int64_t> rows;
  std::vector<int> writer_states;
  bool stopping = false, first_step = true;
  // auto balancing: each rank's compute seconds per micro-batch in every step since the last
  // decision; the decision uses the median, so one disturbed step does not move the split. The
  // first step (allocation, cold caches) is not measured; the first decision comes after four
  // measured steps, later ones every --rebalance-every steps.
  std::vector<std::vector<double>> window(static_cast<size_t>(W));
  int64_t next_decision = 5;
  const int64_t start_epoch = step / steps_per_epoch;
  for (int64_t epoch = start_epoch; epoch < n_epochs && step < total_steps && !stopping; ++epoch) {
    const auto t_epoch = Clock::now();
    const int64_t s0 = epoch == start_epoch ? step % steps_per_epoch : 0;  // mid-epoch after a resume
    const int64_t epoch_steps = std::min(steps_per_epoch - s0, total_steps - step);
    // One bar per epoch ("epoch 2/3 [###..] 40% 12/30 steps ... eta"); the extra text carries the
    // loss, the throughput, the slowest rank and, for multi-epoch runs, the ETA of the whole run.
    Progress progress(strcat("epoch ", epoch + 1, "/", n_epochs), epoch_steps, "steps",
                      opt.progress && rank0 ? 0.0 : 1e30);
    double epoch_loss = 0;
    int64_t epoch_tokens = 0;
    for (int64_t s = s0; s < steps_per_epoch && step < total_steps; ++s, ++step) {
      const auto t_step = Clock::now();
      if (dev) dev->zero_grads();
      else model.zero_grads();
      // Loss tokens of the whole global batch first, so every micro-batch on every rank is scaled
      // by 1/global count and the update is the same for any split of the step.
      int64_t step_tokens = 0;
      for (int64_t i = 0; i < global_batch; ++i) {
        const uint8_t* m = ds.train.row_mask(order.row(epoch, s * global_batch + i));
        for (int t = 1; t <= T; ++t) step_tokens += m[t];
      }
      const float dloss = step_tokens > 0 ? 1.0f / float(step_tokens) : 0.0f;
      // This rank's micro-batches: a contiguous run of the step's global order.
      int first_mb = 0;
      for (int r = 0; r < rank; ++r) first_mb += split[size_t(r)];
      double loss_sum = 0, compute_s = 0;
      for (int a = first_mb; a < first_mb + split[size_t(rank)]; ++a) {
        const auto t_mb = Clock::now();
        rows.clear();
        for (int i = 0; i < b; ++i) rows.push_back(order.row(epoch, s * global_batch + int64_t(a) * b + i));
        mb.fill(ds.train, rows);
        if (dev) {
          loss_sum += dev->forward(mb.batch());
          if (a + 1 == first_mb + split[size_t(rank)]) dev->backward_last(mb.batch(), dloss);
          else dev->backward(mb.batch(), dloss);
        } else {
          loss_sum += model.forward(mb.batch());
          model.backward(mb.batch(), dloss);
        }
        double mb_s = seconds_since(t_mb);
        if (rank == slowdown.rank && slowdown.factor > 1) {
          // Busy-wait, not sleep: a slower device stays busy, and a sleeping vCPU wakes late and
          // cold, which would make the simulated rank's timing noisy.
          const auto until = t_mb + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(mb_s * slowdown.factor));
          while (Clock::now() < until) {
          }
          mb_s = seconds_since(t_mb);
        }
        compute_s += mb_s;
      }
      const float lr = sched.at(step);
      // A checkpoint started after the last step copies the weights and moments in the
      // background while this step's passes ran; the update must not change them before that
      // (on a device the host copies change only at the next checkpoint, after its settle).
      if (writer) writer->wait_snapshot();
      double grad_norm;
      if (dev) {
        grad_norm = dev->zero_reduce_and_clip(opt.grad_clip);
        dev->zero_step(lr, step + 1);
      } else {
        zero.reduce_gradients(model.grads().data());
        grad_norm = zero.clip_gradients(model.grads().data(), opt.grad_clip);
        zero.step(model.params().data(), model.grads().data(), lr, step + 1);
      }
      loss_sum = comm.allreduce_sum(loss_sum);

      bool stop = false;
      const StepTimes times = gather_step_times(comm, compute_s, seconds_since(t_step),
                                                writer ? int(writer->state()) : 0, g_stop_signal.load(),
                                                &writer_states, &stop);
      const double step_s = seconds_since(t_step);
      const double loss = step_tokens > 0 ? loss_sum / double(step_tokens) : 0.0;
      if (!std::isfinite(loss) || !std::isfinite(grad_norm))
        throw CollectiveError(strcat("train: loss or gradient norm became non-finite at step ", step + 1, " (loss ",
                                     loss, ", grad_norm ", grad_norm, "); try a lower --lr"));
      if (first_step) result.first_loss = loss, first_step = false;
      result.last_loss = loss;
      epoch_loss += loss_sum;
      epoch_tokens += step_tokens;
      const int64_t tokens = global_batch * T;
      nlohmann::json sj = {{"type", "step"}, {"step", step + 1}, {"epoch", epoch}, {"loss", loss},
                           {"lr", lr}, {"grad_norm", grad_norm}, {"tokens", tokens},
                           {"loss_tokens", step_tokens}, {"step_ms", step_s * 1e3},
                           {"tokens_per_s", double(tokens) / step_s}};
      // Model FLOPs utilisation per rank against its measured GEMM rate: the FLOPs of its
      // micro-batches (Llama2Config::flops_per_token) over the step time.
      {
        std::vector<double> mfu;
        for (int r = 0; r < W; ++r)
          mfu.push_back(double(split[size_t(r)]) * b * T * cfg.flops_per_token(T) /
                        (step_s * rank_tflops[size_t(r)] * 1e12));
        sj["rank_mfu"] = mfu;
      }
      // Rank 0's device memory high-water mark so far, and the driver's view on a GPU (GPU check).
      if (const DeviceMemoryUse mu = dev ? dev->memory_use() : DeviceMemoryUse{}; mu.peak_bytes > 0) {
        sj["device_peak_bytes"] = mu.peak_bytes;
        if (mu.driver_used_peak_bytes > 0) sj["device_driver_used_peak_bytes"] = mu.driver_used_peak_bytes;
      }
      if (writer)
        sj["ckpt_writing"] = std::any_of(writer_states.begin(), writer_states.end(),
                                         [](int st) { return st == CheckpointWriter::kWriting; });
      if (W > 1) {
        std::vector<double> c_ms, w_ms;
        for (int r = 0; r < W; ++r) c_ms.push_back(times.compute[size_t(r)] * 1e3), w_ms.push_back(times.wait[size_t(r)] * 1e3);
        sj["split"] = split;
        sj["rank_compute_ms"] = c_ms;
        sj["rank_wait_ms"] = w_ms;
        sj["slowest_rank"] = times.slowest;
        sj["balance"] = times.balance;
      }
      metrics.write(sj);

      if (balance == BalanceMode::kAuto && W > 1) {
        if (step > 0)
          for (int r = 0; r < W; ++r)
            if (split[size_t(r)] > 0) window[size_t(r)].push_back(times.compute[size_t(r)] / split[size_t(r)]);
        if (step + 1 >= next_decision && !window[0].empty()) {
          std::vector<double> per_mb(static_cast<size_t>(W));
          for (int r = 0; r < W; ++r) per_mb[size_t(r)] = median(window[size_t(r)]);
          const Rebalance rb = propose_rebalance(split, per_mb);
          if (rb.take) {
            if (say)
              std::fprintf(stderr, "%strain: step %lld: rebalanced [%s] -> [%s], predicted compute per step %.0f -> %.0f ms\n",
                           opt.progress ? "\n" : "", (long long)step + 1, join(split).c_str(), join(rb.split).c_str(),
                           rb.predicted_now * 1e3, rb.predicted_new * 1e3);
            metrics.write({{"type", "rebalance"}, {"step", step + 1}, {"from", split}, {"to", rb.split},
                           {"seconds_per_micro_batch", per_mb}, {"predicted_ms_before", rb.predicted_now * 1e3},
                           {"predicted_ms_after", rb.predicted_new * 1e3}});
            split = rb.split;
          }
          for (auto& w : window) w.clear();
          next_decision = step + 1 + opt.rebalance_every;
        }
      }

      // Checkpoints: publish the one in flight once every rank has written its part; start one at
      // the end of an epoch, every --checkpoint-every steps, and on a stop signal (then wait).
      if (writer) {
        if (writer->pending_step() >= 0 &&
            std::none_of(writer_states.begin(), writer_states.end(), [](int st) { return st == CheckpointWriter::kWriting; }))
          finish_checkpoint(writer_states, false);
        const bool epoch_end = s + 1 == steps_per_epoch || step + 1 == total_steps;
        const bool every = opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0;
        if (epoch_end || every || stop) start_checkpoint(step + 1);
        if (stop) {
          settle_checkpoint(true);
          if (say)
            std::fprintf(stderr, "%strain: stop signal: checkpoint of step %lld written to %s; resume with --resume auto\n",
                         opt.progress ? "\n" : "", (long long)step + 1, opt.checkpoint_dir.c_str());
          result.stopped_by_signal = true;
          stopping = true;
          ++step;
          break;
        }
      }

      const double elapsed = seconds_since(t_start);
      char extra[200];
      std::snprintf(extra, sizeof extra, "loss %.4f %.0f tok/s", loss, double(tokens) / step_s);
      std::string line = extra;
      if (W > 1) {
        std::snprintf(extra, sizeof extra, " slowest r%d %.0f ms balance %.2f", times.slowest,
                      times.compute[size_t(times.slowest)] * 1e3, times.balance);
        line += extra;
      }
      if (n_epochs > 1)
        line += " run eta " + format_eta(elapsed / double(step + 1) * double(total_steps - step - 1));
      progress.update(s + 1 - s0, line);
    }
    if (stopping) break;
    const double epoch_s = seconds_since(t_epoch);
    int64_t test_tokens = 0;
    const double test_sum =
        ds.test.n_seq == 0 ? 0.0
        : dev ? evaluate_split_with([&](const Batch& b) { return dev->forward(b); }, ds.test, opt.batch_size,
                                    &test_tokens, comm)
              : evaluate_split(model, ds.test, opt.batch_size, &test_tokens, comm);
    const double test_loss = test_tokens > 0 ? test_sum / double(test_tokens) : NAN;
    result.test_loss = std::isfinite(test_loss) ? test_loss : -1;
    nlohmann::json ej = {{"type", "epoch"}, {"epoch", epoch}, {"step", step},
                         {"epoch_time_s", epoch_s},
                         {"tokens_per_s", double(epoch_steps * global_batch * T) / epoch_s},
                         {"train_loss", epoch_tokens ? epoch_loss / double(epoch_tokens) : 0.0}};
    ej["test_loss"] = std::isfinite(test_loss) ? nlohmann::json(test_loss) : nlohmann::json(nullptr);
    if (W > 1) ej["split"] = split;
    metrics.write(ej);
    progress.finish();
    if (say) {
      std::fprintf(stderr, "train: epoch %lld done in %.1f s, train loss %.4f, test loss %s\n",
                   (long long)epoch + 1, epoch_s, epoch_tokens ? epoch_loss / double(epoch_tokens) : 0.0,
                   std::isfinite(test_loss) ? strcat(test_loss).c_str() : "n/a (no test split)");
    }
  }
  settle_checkpoint(true);
  if (writer) writer->wait();  // rank 0's publication
  result.steps = step;
  result.split = split;
  result.seconds = seconds_since(t_start);

  if (!opt.output.empty() && !result.stopped_by_signal) {
    // The device holds each rank's range of the master weights: gather them on the host.
    if (dev) {
      dev->zero_state_to_host(zero, model.params().data());
      if (zero.stage() > 0 && W > 1) comm.allgather(model.params().data(), zero.shards().shard, DType::kF32);
    }
    result.model_path = opt.output + "/model.h5";
    save_model(result.model_path);
  }
  return result;
}

}  // namespace lt
