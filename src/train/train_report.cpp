// What a training run tells its user: the start-of-run summary and tables on stderr, the
// metrics records (JSONL), the progress line and the per-epoch summary.
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "llamatrain/error.h"
#include "llamatrain/memory.h"
#include "llamatrain/fsutil.h"
#include "train/train_parts.h"

namespace lt {

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::open(const std::string& path, bool append) {
  if (path.empty()) return;
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) fail(strcat(path, ": cannot open for writing (--metrics: ", std::strerror(errno), ")"));
  path_ = path;
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  size_ = end > 0 ? uint64_t(end) : 0;
}

namespace {

// Writes all of s with O_APPEND writes; 0 or the errno of the failure.
int append_all(int fd, const std::string& s) {
  for (size_t done = 0; done < s.size();) {
    const ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    done += size_t(w);
  }
  return 0;
}

}  // namespace

void MetricsWriter::write(const nlohmann::json& j) {
  if (fd_ < 0) return;
  const std::string line = j.dump() + '\n';
  const int err = append_all(fd_, line);
  if (err == 0) {
    size_ += line.size();
    ++written_;
    return;
  }
  // A part of the line may have landed: cut it off (best effort; the next whole line follows).
  if (::ftruncate(fd_, off_t(size_)) != 0) {
  }
  if (lost_++ == 0) {
    first_error_ = std::strerror(err);
    std::fprintf(stderr, "train: warning: --metrics %s: cannot write a record (%s); training goes on, the records "
                 "lost are counted\n", path_.c_str(), first_error_.c_str());
  }
}

int64_t MetricsWriter::report_lost(bool say) const {
  if (say && lost_ > 0)
    std::fprintf(stderr, "train: warning: --metrics %s: %lld of %lld records could not be written (first: %s)\n",
                 path_.c_str(), (long long)lost_, (long long)(lost_ + written_), first_error_.c_str());
  return lost_;
}

std::string format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

namespace {

// The start-of-run device table, ranks grouped by node:
//   node  rank  device  SMs  memory  cc  GEMM TFLOP/s
std::string format_device_table(const RankDevices& d) {
  const std::vector<std::string>& hosts = d.hosts;
  std::vector<int> order(hosts.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = int(r);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return hosts[size_t(a)] < hosts[size_t(b)]; });
  std::string out = strcat("devices (GEMM rate measured at start: ", d.gemm_what, " on rank 0)\n");
  char line[512];
  std::snprintf(line, sizeof line, "  %-16s %5s  %-48s %4s %10s %5s %12s\n", "node", "rank", "device", "SMs", "memory",
                "cc", "GEMM TFLOP/s");
  out += line;
  std::string last;
  for (int r : order) {
    const double* n = d.nums.data() + size_t(r) * RankDevices::kNums;
    const std::string host = hosts[size_t(r)] == last ? "" : hosts[size_t(r)];
    last = hosts[size_t(r)];
    std::snprintf(line, sizeof line, "  %-16s %5d  %-48s %4d %6.1f GiB %2d.%-2d %12.3f\n", host.c_str(), r,
                  d.names[size_t(r)].substr(0, 48).c_str(), int(n[0]), n[1] / double(1ull << 30), int(n[2]), int(n[3]),
                  n[4]);
    out += line;
  }
  return out;
}

}  // namespace

void report_start(const TrainOptions& opt, const TrainSetup& setup, const TrainModel& m, const RankDevices& devices,
                  const std::vector<int>& split, int W, MetricsWriter& metrics, bool say) {
  const Llama2Config& cfg = setup.cfg;
  const int T = setup.seq_len();
  // The CPU's accounting (fp32 everywhere, zero.h) or the CUDA backend's (bf16 weights, fp32
  // gradients, master and Adam, the slots of stages 2 and 3: device_memory_table), each with its
  // pass's activations for the micro-batch; the gradient shards of stages 2 and 3 are bf16 with
  // --grad-reduce-dtype bf16 on both.
  const double activations = double(m.engine->activation_bytes(opt.batch_size, T));
  const double shard_grad_bytes = opt.grad_reduce_dtype == DType::kBF16 ? 2.0 : 4.0;
  auto mem =
      setup.device == DeviceKind::cpu
          ? memory_table(m.n_params, W, opt.zero_stage, activations, zero_block_bytes(m.model.layout(), opt.zero_stage),
                         shard_grad_bytes)
          : device_memory_table(m.model.layout(), W, opt.zero_stage, activations, shard_grad_bytes, opt.zero3_prefetch,
                                opt.offload_optimizer);
  if (const LoraLayout* lora = m.model.lora())
    mem = lora_memory_table(m.model.layout(), lora->total(), W, opt.zero_stage, activations,
                            setup.device != DeviceKind::cpu, opt.zero3_prefetch);
  const bool cpu_bf16 = setup.device == DeviceKind::cpu && setup.precision == Precision::kBf16;
  if (cpu_bf16) {
    // The bf16 copies the products read (Bf16Matmuls): the weights' with the parameters, the
    // operands' with the activations, ZeRO 3's one layer's with the blocks.
    const Bf16CopyBytes b = cpu_bf16_copy_bytes(cfg, m.zero.padded_size(), opt.zero_stage, opt.batch_size, T,
                                                setup.recompute);
    for (MemoryRow& r : mem) r.params += b.weights, r.activations += b.operands, r.gathered += b.blocks;
  }
  if (say) {
    std::fprintf(stderr,
                 "train: model %s (%.2fM parameters), data %s: %lld train / %lld test sequences of %d tokens\n"
                 "train: %lld steps (%lld per epoch), global batch %lld = %lld micro-batches of %d, %d rank(s), "
                 "ZeRO stage %d, %s gradient reduction, recompute %s, precision %s, balance %s, split [%s], threads %d per rank, seed %llu\n",
                 cfg.to_string().c_str(), double(cfg.num_parameters()) / 1e6, opt.data.c_str(),
                 (long long)setup.ds.train.n_seq, (long long)setup.ds.test.n_seq, T,
                 (long long)setup.steps.total_steps, (long long)setup.steps.steps_per_epoch,
                 (long long)setup.global_batch, (long long)setup.micro_batches, opt.batch_size, W, opt.zero_stage,
                 dtype_name(opt.grad_reduce_dtype),
                 recompute_name(setup.recompute),
                 setup.device == DeviceKind::cpu ? precision_name(setup.precision) : "bf16",
                 balance_mode_name(setup.balance), join(split).c_str(),
                 omp_get_max_threads(), (unsigned long long)opt.seed);
    if (const LoraLayout* lora = m.model.lora())
      std::fprintf(stderr, "train: LoRA rank %d, alpha %g, dropout %g on %s: %zu trained parameters (%.3g%% of the model), "
                   "the base frozen\n", lora->config().rank, double(lora->config().alpha), double(lora->config().dropout),
                   lora_targets_string(lora->config().targets).c_str(), lora->total(),
                   100.0 * double(lora->total()) / double(m.n_params));
    const int64_t test_batches = (setup.ds.test.n_seq + opt.batch_size - 1) / opt.batch_size;
    if (opt.eval_batches > 0 && opt.eval_batches < test_batches)
      std::fprintf(stderr, "train: test loss over the first %lld of %lld test micro-batches (--eval-batches)\n",
                   (long long)opt.eval_batches, (long long)test_batches);
    if (setup.slowdown.rank >= 0)
      std::fprintf(stderr, "train: SIMULATED slowdown: rank %d computes %.2fx slower (it busy-waits the difference)\n",
                   setup.slowdown.rank, setup.slowdown.factor);
    std::fprintf(stderr, "%s", format_memory_table(mem, opt.zero_stage, dtype_name(opt.grad_reduce_dtype),
                                                         m.model.lora() != nullptr).c_str());
    if (cpu_bf16)
      std::fprintf(stderr, "  (--precision bf16: params include the weights' bf16 copy, activations the bf16 copies "
                   "of the products' operands%s)\n", opt.zero_stage == 3 ? ", blocks one layer's bf16 weights" : "");
    if (opt.offload_optimizer)
      std::fprintf(stderr, "  (--offload-optimizer: the fp32 master weights and Adam m, v, %.2f MiB on rank 0, are in "
                   "host memory and the update runs there)\n",
                   12.0 * double(m.zero.own_end() - m.zero.own_begin()) / (1024.0 * 1024.0));
    std::fprintf(stderr, "%s", format_device_table(devices).c_str());
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < W; ++r) {
    const double* d = devices.nums.data() + size_t(r) * RankDevices::kNums;
    ranks.push_back({{"rank", r}, {"host", devices.hosts[size_t(r)]}, {"device", devices.names[size_t(r)]},
                     {"sm_count", int(d[0])}, {"memory_bytes", d[1]},
                     {"compute_capability", strcat(int(d[2]), ".", int(d[3]))}, {"gemm_tflops", d[4]},
                     {"peak_tflops", d[5]}, {"threads", devices.threads(r)}});
  }
  metrics.write({{"type", "devices"}, {"device", device_name(setup.device)}, {"gemm", devices.gemm_what},
                 {"peak", devices.peak_what}, {"ranks", ranks}});
  nlohmann::json rows = nlohmann::json::array();
  for (const MemoryRow& r : mem)
    rows.push_back({{"rank", r.rank}, {"params_bytes", r.params}, {"grads_bytes", r.grads},
                    {"optimizer_bytes", r.optimizer}, {"activation_bytes", r.activations},
                    {"gathered_bytes", r.gathered}, {"workspace_bytes", r.workspace}, {"total_bytes", r.total()}});
  // host_rss_before_model_bytes: rank 0's resident memory before the model was allocated (the
  // program, its libraries, the data), for comparing the steps' host_peak_rss_bytes with the table.
  // host_state_bytes: the fp32 weights and Adam m, v rank 0's host holds (on a device, only as the
  // staging of checkpoints and the final model: one shard's from ZeRO 1 on).
  const auto f32_bytes = [](const std::vector<float>& v) { return double(v.size() * sizeof(float)); };
  const double host_state = f32_bytes(m.model.params()) + f32_bytes(m.zero.shard_params()) +
                            (m.frozen_base ? f32_bytes(m.frozen_base->params()) : 0.0) +
                            f32_bytes(std::as_const(m.zero).adamw().m()) +
                            f32_bytes(std::as_const(m.zero).adamw().v());  // const: keeps moments_zero
  metrics.write({{"type", "memory"}, {"world_size", W}, {"zero_stage", opt.zero_stage},
                 {"grad_reduce_dtype", dtype_name(opt.grad_reduce_dtype)}, {"offload_optimizer", opt.offload_optimizer},
                 {"n_params", m.n_params},
                 {"ranks", rows}, {"host_rss_before_model_bytes", setup.rss_before_model},
                 {"host_state_bytes", host_state}});
}

nlohmann::json step_record(int64_t step, int64_t epoch, float lr, const StepOutcome& o, double step_s,
                           const StepSync& sync, const std::vector<int>& split, const TrainSetup& setup, int b,
                           const RankDevices& devices, const DeviceMemoryUse& mu, bool checkpointing) {
  const int W = int(split.size());
  const int T = setup.seq_len();
  const int64_t tokens = setup.global_batch * T;
  nlohmann::json sj = {{"type", "step"}, {"step", step + 1}, {"epoch", epoch + 1}, {"loss", o.loss},
                       {"lr", lr}, {"grad_norm", o.grad_norm}, {"tokens", tokens},
                       {"loss_tokens", o.loss_tokens}, {"step_ms", step_s * 1e3},
                       {"tokens_per_s", double(tokens) / step_s}, {"optimizer_ms", o.optimizer_s * 1e3},
                       {"unix_time_s", unix_time_s()}};
  // Model FLOPs utilisation per rank: the FLOPs of its micro-batches (TrainSetup::flops_per_token)
  // over the step time, against its dense peak (rank_mfu; null for a GPU not in the datasheet
  // table) and against its GEMM rate measured at start (mfu_vs_measured_gemm, which can pass 1:
  // the probe's 512^3 product runs slower than a model's larger ones).
  nlohmann::json mfu = nlohmann::json::array(), vs_gemm = nlohmann::json::array();
  for (int r = 0; r < W; ++r) {
    const double tflops = double(split[size_t(r)]) * b * T * setup.flops_per_token(T) / step_s / 1e12;
    const double peak = devices.peak_tflops(r);
    mfu.push_back(peak > 0 ? nlohmann::json(tflops / peak) : nlohmann::json(nullptr));
    vs_gemm.push_back(tflops / devices.gemm_tflops(r));
  }
  sj["rank_mfu"] = mfu;
  // Rank 0's step time by op family on the CPU (the rest: data, loss bookkeeping, waiting).
  if (setup.device == DeviceKind::cpu) {
    const double known = o.ops.products + o.ops.attention + o.ops.elementwise + o.optimizer_s;
    sj["breakdown_ms"] = {{"products", o.ops.products * 1e3}, {"attention", o.ops.attention * 1e3},
                          {"elementwise", o.ops.elementwise * 1e3}, {"optimizer", o.optimizer_s * 1e3},
                          {"other", std::max(0.0, step_s - known) * 1e3}};
    sj["host_peak_rss_bytes"] = host_peak_rss_bytes();
    if (setup.precision == Precision::kBf16) sj["host_bf16_copy_peak_bytes"] = o.bf16_copy_peak_bytes;
  }
  // Rank 0's ZeRO traffic (ring volumes, zero_blocks.h; on a device its optimizer's collectives),
  // also as a multiple of plain data parallelism's one all-reduce of the fp32 gradient
  // (2 n (W-1)/W bytes).
  if (W > 1) {
    const double dp = 2 * ring_bytes(4.0 * double(setup.cfg.num_parameters()), W);
    sj["comm_bytes"] = {{"allreduce", o.comm.allreduce}, {"reduce_scatter", o.comm.reduce_scatter},
                        {"allgather", o.comm.allgather}, {"total", o.comm.total()},
                        {"vs_data_parallel", o.comm.total() / dp}};
  }
  sj["mfu_vs_measured_gemm"] = vs_gemm;
  // Rank 0's device memory high-water mark so far, and the driver's view on a GPU (GPU check).
  if (mu.peak_bytes > 0) {
    sj["device_peak_bytes"] = mu.peak_bytes;
    if (mu.driver_used_peak_bytes > 0) sj["device_driver_used_peak_bytes"] = mu.driver_used_peak_bytes;
  }
  // What each rank's device runtime did in the step (allocations, synchronisations, copies,
  // cuBLASLt plans): zeros in a steady state but for the few copies and waits a step needs.
  if (setup.device != DeviceKind::cpu && !sync.device_calls.empty()) {
    nlohmann::json calls = nlohmann::json::object();
    for (int i = 0; i < DeviceCallCounts::kFields; ++i) {
      nlohmann::json per_rank = nlohmann::json::array();
      for (const DeviceCallCounts& c : sync.device_calls) per_rank.push_back(int64_t(c.values()[size_t(i)]));
      calls[DeviceCallCounts::names()[i]] = per_rank;
    }
    sj["device_calls"] = calls;
  }
  if (checkpointing)
    sj["ckpt_writing"] = std::any_of(sync.writer_states.begin(), sync.writer_states.end(),
                                     [](int st) { return st == CheckpointWriter::kWriting; });
  if (W > 1) {
    std::vector<double> c_ms, w_ms;
    for (int r = 0; r < W; ++r)
      c_ms.push_back(sync.times.compute[size_t(r)] * 1e3), w_ms.push_back(sync.times.wait[size_t(r)] * 1e3);
    sj["split"] = split;
    sj["rank_compute_ms"] = c_ms;
    sj["rank_wait_ms"] = w_ms;
    sj["slowest_rank"] = sync.times.slowest;
    sj["balance"] = sync.times.balance;
  }
  return sj;
}

double RunLosses::mean(size_t from, size_t to) const {
  double sum = 0;
  int64_t tokens = 0;
  for (size_t i = from; i < to; ++i) sum += sums_[i], tokens += tokens_[i];
  return tokens > 0 ? sum / double(tokens) : NAN;
}

double RunLosses::recent() const {
  const size_t n = sums_.size();
  return mean(n - std::min(n, kWindow), n);
}

LossEnds RunLosses::ends() const {
  const size_t n = sums_.size();
  LossEnds e;
  if (n == 0) return e;
  const size_t k = std::min(kWindow, std::max<size_t>(1, n / 2));
  e.steps = int(k), e.first = mean(0, k), e.last = mean(n - k, n);
  return e;
}

double run_eta_s(double elapsed_s, int64_t done_here, int64_t left) {
  return done_here > 0 ? elapsed_s / double(done_here) * double(left) : NAN;
}

std::string progress_text(double loss, double test_loss, double tokens_per_s, const StepTimes& times, int W,
                          int64_t n_epochs, double eta_s) {
  char extra[200];
  std::snprintf(extra, sizeof extra, "loss %.4f", loss);
  std::string line = extra;
  if (std::isfinite(test_loss)) {
    std::snprintf(extra, sizeof extra, " test %.4f", test_loss);
    line += extra;
  }
  std::snprintf(extra, sizeof extra, " %.0f tok/s", tokens_per_s);
  line += extra;
  if (W > 1) {
    std::snprintf(extra, sizeof extra, " slowest r%d %.0f ms balance %.2f", times.slowest,
                  times.compute[size_t(times.slowest)] * 1e3, times.balance);
    line += extra;
  }
  if (n_epochs > 1) line += " run eta " + format_eta(eta_s);
  return line;
}

double unix_time_s() {
  using namespace std::chrono;
  return double(duration_cast<microseconds>(system_clock::now().time_since_epoch()).count()) * 1e-6;
}

void report_eval(int64_t steps_done, int64_t epoch, double test_loss, double seconds, MetricsWriter& metrics,
                 bool say) {
  metrics.write({{"type", "eval"}, {"step", steps_done}, {"epoch", epoch + 1}, {"test_loss", test_loss},
                 {"eval_s", seconds}, {"unix_time_s", unix_time_s()}});
  if (say) std::fprintf(stderr, "train: step %lld: test loss %.4f (%.1f s)\n", (long long)steps_done, test_loss, seconds);
}

void report_rebalance(int64_t step, const std::vector<int>& from, const AutoBalancer::Decision& d,
                      MetricsWriter& metrics, bool say, bool progress) {
  const Rebalance& rb = d.rebalance;
  if (say)
    std::fprintf(stderr, "%strain: step %lld: rebalanced [%s] -> [%s], predicted compute per step %.0f -> %.0f ms\n",
                 progress ? "\n" : "", (long long)step + 1, join(from).c_str(), join(rb.split).c_str(),
                 rb.predicted_now * 1e3, rb.predicted_new * 1e3);
  metrics.write({{"type", "rebalance"}, {"step", step + 1}, {"from", from}, {"to", rb.split},
                 {"seconds_per_micro_batch", d.seconds_per_micro_batch}, {"predicted_ms_before", rb.predicted_now * 1e3},
                 {"predicted_ms_after", rb.predicted_new * 1e3}});
}

void report_epoch(const EpochSummary& e, const TrainSetup& setup, const std::vector<int>& split, int W,
                  MetricsWriter& metrics, bool say) {
  const double train_loss = e.loss_tokens ? e.loss_sum / double(e.loss_tokens) : 0.0;
  nlohmann::json ej = {{"type", "epoch"}, {"epoch", e.epoch + 1}, {"step", e.step}, {"unix_time_s", unix_time_s()},
                       {"epoch_time_s", e.seconds},
                       {"tokens_per_s", double(e.steps * setup.global_batch * setup.seq_len()) / e.seconds},
                       {"train_loss", train_loss}};
  ej["test_loss"] = std::isfinite(e.test_loss) ? nlohmann::json(e.test_loss) : nlohmann::json(nullptr);
  ej["complete"] = e.complete;
  if (W > 1) ej["split"] = split;
  metrics.write(ej);
  if (!say) return;
  const std::string test = std::isfinite(e.test_loss) ? strcat(e.test_loss) : "n/a (no test split)";
  if (e.complete)
    std::fprintf(stderr, "train: epoch %lld done in %.1f s, train loss %.4f, test loss %s\n", (long long)e.epoch + 1,
                 e.seconds, train_loss, test.c_str());
  else
    std::fprintf(stderr, "train: stopped at step %lld, %lld of epoch %lld's %lld steps run (the run's step limit), "
                 "in %.1f s, train loss %.4f, test loss %s\n", (long long)e.step, (long long)e.steps,
                 (long long)e.epoch + 1, (long long)e.steps_per_epoch, e.seconds, train_loss, test.c_str());
}

}  // namespace lt
