// The parts of run_training (trainer.cpp), each with one job, in the order a run uses them; the
// loop in trainer.cpp only calls them (torchtitan's Trainer and llm.c's main read in the same
// phases):
//   train_setup.cpp       options and inputs checked alike on every rank; the model, its ZeRO
//                         optimizer and the device that runs them; every rank's device
//   train_resume.cpp      the newest checkpoint that loads on every rank
//   train_step.cpp        one optimizer step: micro-batches, gradient reduction, update; the
//                         step's one small collective (timings, checkpoint writers, stop signal)
//   train_checkpoint.cpp  when to checkpoint, and the writer's start / settle / publish
//   train_eval.cpp        the held-out loss
//   train_report.cpp      the start-of-run summary, the metrics records, the progress line
// balance.cpp holds the auto balancer that moves micro-batches between ranks.
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llamatrain/balance.h"
#include "llamatrain/checkpoint.h"
#include "llamatrain/comm.h"
#include "llamatrain/config.h"
#include "llamatrain/dataset.h"
#include "llamatrain/device.h"
#include "llamatrain/engine.h"
#include "llamatrain/loader.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/optim.h"
#include "llamatrain/trainer.h"
#include "llamatrain/zero.h"

namespace lt {

using TrainClock = std::chrono::steady_clock;
inline double seconds_since(TrainClock::time_point t0) {
  return std::chrono::duration<double>(TrainClock::now() - t0).count();
}

// ---- setup (train_setup.cpp) -----------------------------------------------------------------

// How long the run is. An epoch is steps_per_epoch whole global batches (the rows left over at
// the end of a pass are skipped); total_steps is --max-steps when given, else --epochs passes;
// n_epochs is the number of passes those steps touch (the last one may be partial). Steps and
// epochs are 0-based inside the trainer: step s belongs to epoch s / steps_per_epoch.
struct StepCounts {
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 0;
  int64_t n_epochs = 0;
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch; }
};
StepCounts count_steps(int64_t n_train_seq, int64_t global_batch, int64_t max_steps, int64_t epochs);

// Everything the options and the inputs decide, found alike on every rank.
struct TrainSetup {
  Dataset ds;
  ModelData init;  // --init-from's model (its params move into the model); empty for a preset
  // A shard-only host (engine.h, host_holds_only_shard) from an HDF5 model: init holds its header only, and
  // each rank reads its shard (read_model_range) when the model is made.
  bool init_by_shard = false;
  Llama2Config cfg;
  // The training FLOPs per token of a sequence of T tokens, the MFU's numerator: the model's, and
  // with LoRA what the adapters change (LoraLayout::flops_per_token_delta).
  double lora_flops_delta = 0;
  double flops_per_token(int T) const { return cfg.flops_per_token(T) + lora_flops_delta; }
  BalanceMode balance = BalanceMode::kOff;
  Recompute recompute = Recompute::kNone;
  Precision precision = Precision::kFp32;  // the CPU's matrix products (the CUDA backend: always bf16)
  DeviceKind device = DeviceKind::cpu;
  std::vector<double> weights;  // the balancer's starting weights, one per rank
  Slowdown slowdown;
  int64_t global_batch = 0;     // sequences per optimizer step
  int64_t micro_batches = 0;    // global_batch / batch_size
  StepCounts steps;
  double rss_before_model = 0;  // this process's resident bytes after the checks, before the model
  int seq_len() const { return ds.info.seq_len; }
};
// Checks the options, loads the data and the model's config; a problem on any rank throws
// CollectiveError on every rank (agree()). Rank 0 creates --output.
TrainSetup check_training_setup(const TrainOptions& opt, Comm& comm);

// The model's host state, its ZeRO optimizer and the engine that runs them on this rank's device
// (engine.h: the CPU's, or an accelerator's, which keeps its own working weights, gradients and
// optimizer state and overlaps the gradient reduction with backward). The host keeps the weights
// (zero.shard_params() where it holds only this rank's shard, ZeRO 3 and on a device 1-3; the
// whole model.params() otherwise) and zero's Adam arrays: the staging area of checkpoints and of
// the final model.
struct TrainModel {
  // Initialised from --init-from or randomly from the seed, then rank 0's weights everywhere
  // (a collective).
  TrainModel(TrainSetup& setup, const TrainOptions& opt, Comm& comm, bool say);
  Llama2Model model;
  ZeroOptimizer zero;  // of what the run trains: the weights, or with LoRA the adapters
  std::unique_ptr<FrozenShards> frozen_base;  // LoRA at ZeRO 3: this rank's shard of the base; else null
  std::unique_ptr<Engine> engine;
  size_t n_params = 0;

 private:
  // The engine of setup.device over model, zero and frozen_base (on a device: say which).
  void build_engine(const TrainSetup& setup, const TrainOptions& opt, bool say);
  void share_adapters(Comm& comm);
};

// Every rank's device and its measured matrix-product rate (a collective).
struct RankDevices {
  std::vector<std::string> hosts, names;
  static constexpr size_t kNums = 7;
  std::vector<double> nums;  // (ranks, kNums): SMs, memory bytes, cc major, cc minor, GEMM TFLOP/s, peak TFLOP/s,
                             // OpenMP threads (what plan --calibrate labels a CPU rank's rate with)
  std::string gemm_what;     // how this rank measured its GEMM rate
  std::string peak_what;     // where this rank's peak comes from
  std::vector<double> gemm_tflops() const;
  double gemm_tflops(int rank) const { return nums[size_t(rank) * kNums + 4]; }
  double peak_tflops(int rank) const { return nums[size_t(rank) * kNums + 5]; }
  int threads(int rank) const { return int(nums[size_t(rank) * kNums + 6]); }
};
RankDevices gather_rank_devices(const DeviceInfo& mine, Comm& comm);

// ---- resume (train_resume.cpp) ---------------------------------------------------------------

// What a checkpoint must share with this run to continue it.
struct RunIdentity {
  std::string model_config;      // Llama2Config::to_string()
  std::string tokenizer_sha256;  // of the dataset's tokenizer (empty: none)
  std::string data_identity;     // dataset_identity()
  int64_t global_batch = 0;
  std::string lora;              // LoRA: the adapters' configuration and the base (lora_identity); "" without
};
RunIdentity run_identity(const TrainSetup& setup, const TrainOptions& opt, Comm& comm);  // a collective
// Why the checkpoint at `path` cannot continue this run, or "" when it can.
std::string checkpoint_mismatch(const CheckpointInfo& ci, const std::string& path, const RunIdentity& run,
                                bool allow_new_data);

struct ResumePoint {
  int64_t step = 0;             // steps done (0: a fresh start)
  std::string path;             // the checkpoint loaded; empty for a fresh start
  std::vector<int> split;       // the checkpoint's split when it fits this world; else empty
  // The learning-rate schedule the checkpoint's run had (from its /training record); total_steps 0
  // when the checkpoint does not record it.
  LrSchedule schedule{0, 0, 0, 0};
  // --keep-best: the best test loss the checkpoint recorded and its step (-1: none).
  int64_t best_eval_step = -1;
  double best_eval_loss = 0;
};
// --resume auto (newest valid in --checkpoint-dir, damaged ones skipped), none, or a path: loads
// the weights and this rank's Adam state into m (a collective).
ResumePoint resume_training(const TrainOptions& opt, const RunIdentity& run, int64_t micro_batches, TrainModel& m,
                            Comm& comm, bool say);

// What resuming at `step` (steps done) changes in the learning-rate schedule, as one line for the
// console ("" when nothing changes): the total steps old -> new, where the cosine decay now ends,
// and the next step's learning rate under both. --max-steps or --epochs other than the
// checkpoint's run stretch or shorten the decay from here on.
std::string schedule_change(const LrSchedule& before, const LrSchedule& now, int64_t step);

// ---- reporting (train_report.cpp) ------------------------------------------------------------

// The --metrics JSONL file: one object per line, each line one write() at the end of the file
// (rank 0 only; a no-op elsewhere), so every line on disk is whole, for live plots and after a
// crash. A record that cannot be written (a full disk, a file-size limit) is counted and the file
// cut back to its last whole line; the first failure is said once with its reason, and training
// goes on.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void open(const std::string& path, bool append);
  void write(const nlohmann::json& j);
  // At the end of the run: the records that could not be written, also said on stderr (say).
  int64_t report_lost(bool say) const;

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;  // bytes of whole lines in the file
  int64_t written_ = 0, lost_ = 0;
  std::string first_error_;
};

std::string format_eta(double seconds);
std::string join(const std::vector<int>& v);

// ---- one step (train_step.cpp) ---------------------------------------------------------------

// The first micro-batch of `rank` in a step's global order: ranks take contiguous runs.
int first_micro_batch(const std::vector<int>& split, int rank);
// Loss tokens of the global samples [first, first + n) of `epoch` (targets 1..T of each row).
int64_t count_loss_tokens(const TokenSplit& split, DataOrder& order, int64_t epoch, int64_t first, int64_t n, int T);

class Checkpointer;

struct StepOutcome {
  double loss = 0;          // mean loss per loss token of the global batch
  double loss_sum = 0;      // summed over every rank's micro-batches
  int64_t loss_tokens = 0;  // of the global batch
  double grad_norm = 0;     // before clipping
  double compute_s = 0;     // this rank's forward + backward seconds
  DeviceCallCounts device_calls;  // what this rank's device runtime did during the step (zeros on the CPU)
  // On the CPU: where this rank's step time went (op families of its passes).
  OpTimes ops;
  // The gradient reduction, clipping and AdamW: the seconds from the passes' end to the update's
  // (on a device, to the step's read of its losses, which waits for the update).
  double optimizer_s = 0;
  // On the CPU: the bytes this rank sent through the ZeRO collectives in the step (zero_blocks.h).
  CommVolume comm;
  // On the CPU with --precision bf16: the most bytes of bf16 copies the products have held so far.
  size_t bf16_copy_peak_bytes = 0;
  TrainClock::time_point t_start;
};

// One optimizer step of the global batch: this rank's micro-batches (forward, backward, gradients
// accumulated and scaled by 1/global loss tokens), then the ZeRO reduction, clipping and AdamW.
class TrainStepper {
 public:
  TrainStepper(TrainModel& m, const TrainSetup& setup, const TrainOptions& opt, DataOrder& order, Comm& comm);
  // Step `step` (0-based) = step s of `epoch`, split over ranks as `split`, at learning rate lr.
  // Waits for a checkpoint's snapshot before the update changes the weights.
  StepOutcome run(int64_t epoch, int64_t s, int64_t step, const std::vector<int>& split, float lr, Checkpointer& ck);

 private:
  double forward_backward(int64_t epoch, int64_t s, int first_mb, int n_mb, float dloss);
  TrainModel& m_;
  const TokenSplit& train_;
  DataOrder& order_;
  Comm& comm_;
  int b_, T_;
  int64_t global_batch_;
  float grad_clip_;
  Slowdown slowdown_;
  MicroBatch mb_;
  std::vector<int64_t> rows_;
};

// What the ranks measured in one step, gathered so every rank takes the same decisions.
struct StepTimes {
  std::vector<double> compute, wait;  // seconds per rank
  int slowest = 0;
  double balance = 1;  // mean compute / max compute (1 = every rank busy the whole step)
};
struct StepSync {
  StepTimes times;
  std::vector<int> writer_states;  // every rank's CheckpointWriter::State
  bool stop = false;               // a stop signal arrived on some rank
  std::vector<DeviceCallCounts> device_calls;  // every rank's StepOutcome::device_calls
};
// Every step's one small collective: the timings, each rank's checkpoint writer state, whether
// a stop signal arrived anywhere, and each rank's device runtime counts of the step.
StepSync gather_step_times(Comm& comm, double compute_s, double step_s, int writer_state, int signal,
                           const DeviceCallCounts& device_calls = {});

// ---- checkpoints (train_checkpoint.cpp) ------------------------------------------------------

// SIGTERM (Slurm's time limit, scancel), SIGUSR1 (a pre-emption warning with --signal) and SIGINT
// (Ctrl-C) set a flag; the loop checkpoints at the end of the step and stops. A second SIGINT ends
// the process at once. stop_signal() is 0 until then.
void install_stop_handlers();
int stop_signal();

// Whether the step that brought the run to `steps_done` steps ends with a checkpoint: at the end
// of every epoch and of the run, every `every` steps (> 0), and on a stop signal.
bool checkpoint_due(int64_t steps_done, const StepCounts& steps, int64_t every, bool stop);
// The step count of the next checkpoint due after `steps_done` (no signal), or -1 when the run
// ends first (steps_done is its last step).
int64_t next_checkpoint_step(int64_t steps_done, const StepCounts& steps, int64_t every);

// How this run trains, after `steps_done` steps, with the last step's loss and the latest
// test-split loss (NaN: not known): the /training record of checkpoints and model files.
TrainingRecord training_record(const TrainOptions& opt, const TrainSetup& setup, const RunIdentity& run, int world,
                               int64_t steps_done, double train_loss, double eval_loss);

// The description a checkpoint after `steps_done` steps carries.
CheckpointInfo checkpoint_info(const TrainOptions& opt, const TrainSetup& setup, const RunIdentity& run, int world,
                               int64_t steps_done, const std::vector<int>& split, double train_loss, double eval_loss);

// The asynchronous checkpoint writer as the loop uses it: one checkpoint in flight at most,
// published once every rank has written its part, dropped with a warning when one failed (training
// goes on, and the next checkpoint due tries again). Without --checkpoint-dir every call does
// nothing.
class Checkpointer {
 public:
  // Creates the directory and removes the partial checkpoints of a run that died while writing
  // (a collective).
  Checkpointer(const TrainOptions& opt, const StepCounts& steps, const ShardLayout& shards, Comm& comm,
               MetricsWriter& metrics, bool say);
  bool enabled() const { return writer_ != nullptr; }
  int state() const;         // this rank's CheckpointWriter::State (kIdle without a writer)
  void wait_snapshot();      // before the update changes the weights the snapshot copies
  // Settles the checkpoint in flight, then snapshots m's state and writes it in the background.
  void start(const CheckpointInfo& ci, TrainModel& m, const std::string& tokenizer_model);
  // After a step's gather: publishes (or drops) the checkpoint in flight once no rank is writing.
  void poll(const std::vector<int>& writer_states);
  // Waits for this rank's write and agrees with the others (a collective), then publishes it;
  // sync: rank 0 publishes before returning.
  void settle(bool sync);
  void wait();  // this rank's background work (rank 0's publication)
  // After settle(true): whether the checkpoint of `steps_done` steps was published, on every rank
  // (a collective; true without --checkpoint-dir).
  bool published(int64_t steps_done);
  // Rank 0: the newest checkpoint in the directory (DIR/step-N), or "" when there is none.
  std::string newest() const;
  int failures() const { return failures_; }  // checkpoints dropped so far

 private:
  void finish(const std::vector<int>& states, bool sync);
  void report_written(int64_t ck_step);
  void report_dropped(int64_t ck_step);
  const TrainOptions& opt_;
  const StepCounts& steps_;
  Comm& comm_;
  MetricsWriter& metrics_;
  bool say_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<size_t> shard_b_, shard_e_;
  bool said_buffered_io_ = false;
  int failures_ = 0;
};

// ---- evaluation (train_eval.cpp) -------------------------------------------------------------

// Mean loss per loss token of the test split (its first max_batches micro-batches when > 0, as
// --eval-batches asks), NaN without one (a collective).
double test_split_loss(TrainModel& m, const TokenSplit& test, int batch_size, int64_t max_batches, Comm& comm);

// ---- reporting (train_report.cpp) ------------------------------------------------------------

// The start-of-run summary on stderr (say) and the `devices` and `memory` metrics records.
void report_start(const TrainOptions& opt, const TrainSetup& setup, const TrainModel& m, const RankDevices& devices,
                  const std::vector<int>& split, int world, MetricsWriter& metrics, bool say);

// A `step` metrics record of step `step` (0-based) in `epoch` (0-based); the record counts both
// from 1, as the console does ("epoch 1/3").
nlohmann::json step_record(int64_t step, int64_t epoch, float lr, const StepOutcome& o, double step_s,
                           const StepSync& sync, const std::vector<int>& split, const TrainSetup& setup, int batch_size,
                           const RankDevices& devices, const DeviceMemoryUse& memory, bool checkpointing);

// What the run's last line compares: the mean loss per token of its first and its last `steps`
// steps.
struct LossEnds {
  int steps = 0;
  double first = NAN, last = NAN;
};

// The train losses of this process's run, a step at a time, and the means a person reads instead
// of one noisy step: the progress line's over the last kWindow steps, the run's last line's over
// its first and last kWindow (half the steps each when it ran fewer than 2 kWindow, so that the two
// do not overlap). Means are per loss token: a step with few loss tokens counts little.
class RunLosses {
 public:
  static constexpr size_t kWindow = 10;
  void add(double loss_sum, int64_t loss_tokens) { sums_.push_back(loss_sum), tokens_.push_back(loss_tokens); }
  double recent() const;  // NaN before any step
  LossEnds ends() const;

 private:
  double mean(size_t from, size_t to) const;
  std::vector<double> sums_;
  std::vector<int64_t> tokens_;
};

// Seconds left of the run at the rate of this process's own steps: `elapsed_s` for `done_here`
// steps since it started (or resumed), `left` steps to go. NaN before a step.
double run_eta_s(double elapsed_s, int64_t done_here, int64_t left);

// The text after the progress bar: loss (RunLosses::recent), the latest --eval-every test loss (NaN:
// none yet), throughput, the slowest rank, the run's ETA.
std::string progress_text(double loss, double test_loss, double tokens_per_s, const StepTimes& times, int world,
                          int64_t n_epochs, double eta_s);

// Wall-clock time of a metrics record: seconds since the Unix epoch (UTC), to the microsecond.
double unix_time_s();

// An --eval-every evaluation after `steps_done` steps: its `eval` record, and a line on stderr
// (say: only without the progress bar, which shows it instead).
void report_eval(int64_t steps_done, int64_t epoch, double test_loss, double seconds, MetricsWriter& metrics,
                 bool say);

// A rebalancing decision taken: a line on stderr and a `rebalance` record.
void report_rebalance(int64_t step, const std::vector<int>& from, const AutoBalancer::Decision& d,
                      MetricsWriter& metrics, bool say, bool progress);

// The end of an epoch, or where a run stopped inside one (--max-steps): its `epoch` record
// ("complete": false for a part) and summary line.
struct EpochSummary {
  int64_t epoch = 0;     // 0-based
  int64_t step = 0;      // steps done
  int64_t steps = 0;     // steps run in this epoch by this process
  int64_t steps_per_epoch = 0;
  bool complete = true;  // the epoch's last step was run (false: the run's step limit came first)
  double seconds = 0;    // training only: the --eval-every evaluations are not counted
  double loss_sum = 0;   // train loss summed over loss tokens
  int64_t loss_tokens = 0;
  double test_loss = 0;  // NaN without a test split
};
void report_epoch(const EpochSummary& e, const TrainSetup& setup, const std::vector<int>& split, int world,
                  MetricsWriter& metrics, bool say);

}  // namespace lt
