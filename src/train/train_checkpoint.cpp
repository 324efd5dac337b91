// Checkpoints during training: the stop signals, the cadence, and the asynchronous writer's
// start / settle / publish as every rank agrees on them.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/runtime.h"
#include "train/train_parts.h"

namespace lt {

namespace {
std::atomic<int> g_stop_signal{0};
// A second Ctrl-C ends the process at once, as the terminal's user means it (status 130).
// signal() and raise() are async-signal-safe.
extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_stop_signal.load() != 0) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_stop_signal.store(sig);
}
}  // namespace

void install_stop_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

int stop_signal() { return g_stop_signal.load(); }

bool checkpoint_due(int64_t steps_done, const StepCounts& steps, int64_t every, bool stop) {
  const bool epoch_end = steps_done % steps.steps_per_epoch == 0 || steps_done == steps.total_steps;
  return epoch_end || (every > 0 && steps_done % every == 0) || stop;
}

int64_t next_checkpoint_step(int64_t steps_done, const StepCounts& steps, int64_t every) {
  if (steps_done >= steps.total_steps) return -1;
  int64_t next = std::min(steps.total_steps, (steps_done / steps.steps_per_epoch + 1) * steps.steps_per_epoch);
  if (every > 0) next = std::min(next, (steps_done / every + 1) * every);
  return next;
}

TrainingRecord training_record(const TrainOptions& opt, const TrainSetup& setup, const RunIdentity& run, int world,
                               int64_t steps_done, double train_loss, double eval_loss) {
  TrainingRecord r;
  r.tool_version = LLAMATRAIN_VERSION;
  r.command_line = opt.command_line;
  r.data_path = std::filesystem::absolute(opt.data).string();  // the model may travel; say where the data was
  r.data_source_sha256 = setup.ds.info.source_sha256;
  r.data_tokenizer_sha256 = setup.ds.info.tokenizer_sha256;
  r.data_identity = run.data_identity;  // computed once: it counts the dataset's loss tokens
  r.steps = steps_done;
  r.total_steps = setup.steps.total_steps;
  r.epochs = setup.steps.n_epochs;
  r.global_batch = setup.global_batch;
  r.batch_size = opt.batch_size;
  r.lr = opt.lr;
  r.min_lr = opt.min_lr;
  r.warmup_steps = opt.warmup_steps;
  r.weight_decay = opt.adamw.weight_decay;
  r.beta1 = opt.adamw.beta1;
  r.beta2 = opt.adamw.beta2;
  r.grad_clip = opt.grad_clip;
  r.seed = opt.seed;
  r.world_size = world;
  r.zero_stage = opt.zero_stage;
  r.recompute = recompute_name(opt.recompute);
  r.balance = balance_mode_name(opt.balance);
  r.shuffle = opt.shuffle;
  r.train_loss = train_loss;
  r.eval_loss = eval_loss;
  r.unix_time_s = unix_time_s();
  return r;
}

CheckpointInfo checkpoint_info(const TrainOptions& opt, const TrainSetup& setup, const RunIdentity& run, int world,
                               int64_t steps_done, const std::vector<int>& split, double train_loss, double eval_loss) {
  CheckpointInfo ci;
  ci.step = steps_done;
  ci.epoch = setup.steps.epoch_of(steps_done);
  ci.world_size = world;
  ci.zero_stage = opt.zero_stage;
  ci.seed = opt.seed;
  ci.global_batch = setup.global_batch;
  ci.split = split;
  ci.model_config = run.model_config;
  ci.tokenizer_sha256 = run.tokenizer_sha256;
  ci.data_identity = run.data_identity;
  ci.lora = run.lora;
  ci.training = training_record(opt, setup, run, world, steps_done, train_loss, eval_loss);
  return ci;
}

Checkpointer::Checkpointer(const TrainOptions& opt, const StepCounts& steps, const ShardLayout& shards, Comm& comm,
                           MetricsWriter& metrics, bool say)
    : opt_(opt), steps_(steps), comm_(comm), metrics_(metrics), say_(say) {
  for (int r = 0; r < comm.size(); ++r) shard_b_.push_back(shards.begin(r)), shard_e_.push_back(shards.end(r));
  if (opt.checkpoint_dir.empty()) return;
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    make_dirs(opt.checkpoint_dir);
    // Partial checkpoints of a run that died while writing.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(opt.checkpoint_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".step-", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
        std::filesystem::remove_all(e.path(), ec);
    }
  });
  writer_ = std::make_unique<CheckpointWriter>(opt.checkpoint_dir, comm.rank(), comm.size(), opt.keep_last);
}

int Checkpointer::state() const { return writer_ ? int(writer_->state()) : 0; }

void Checkpointer::wait_snapshot() {
  if (writer_) writer_->wait_snapshot();
}

void Checkpointer::start(const CheckpointInfo& ci, TrainModel& m, const std::string& tokenizer_model) {
  if (!writer_) return;
  settle(false);
  const ShardView view = m.engine->host_state(comm_.rank());
  const LoraLayout* lora = m.model.lora();  // a LoRA run checkpoints its adapters
  const double snapshot_s = writer_->start(ci, lora ? lora->table() : TensorTable(m.model.layout()), view, tokenizer_model);
  metrics_.write({{"type", "checkpoint_started"}, {"step", ci.step}, {"snapshot_ms", snapshot_s * 1e3}});
}

void Checkpointer::poll(const std::vector<int>& writer_states) {
  if (writer_ && writer_->pending_step() >= 0 &&
      std::none_of(writer_states.begin(), writer_states.end(), [](int st) { return st == CheckpointWriter::kWriting; }))
    finish(writer_states, false);
}

void Checkpointer::settle(bool sync) {
  if (!writer_ || writer_->pending_step() < 0) return;
  const int st = writer_->wait();
  std::vector<int> states;
  for (double x : comm_.allgather_values({double(st)})) states.push_back(int(x));
  finish(states, sync);
}

void Checkpointer::wait() {
  if (writer_) writer_->wait();
}

bool Checkpointer::published(int64_t steps_done) {
  if (!writer_) return true;
  int64_t step = writer_->published_step();  // rank 0 publishes
  comm_.broadcast(&step, sizeof step, 0);
  return step == steps_done;
}

std::string Checkpointer::newest() const {
  if (!writer_) return "";
  const std::vector<std::string> all = list_checkpoints(opt_.checkpoint_dir);
  return all.empty() ? "" : all[0];
}

// Once every rank reported on the checkpoint in flight: publish it, with every rank file's XXH3 in
// the manifest, or drop it when a rank failed.
void Checkpointer::finish(const std::vector<int>& states, bool sync) {
  bool ok = true;
  for (int st : states) ok = ok && st == CheckpointWriter::kWritten;
  const int64_t ck_step = writer_->pending_step();
  if (!ok) return report_dropped(ck_step);
  std::vector<uint64_t> sums;
  for (const std::string& hex : comm_.allgather_strings(std::to_string(writer_->last_file_xxh3())))
    sums.push_back(std::stoull(hex));
  writer_->publish(shard_b_, shard_e_, sync, sums);
  report_written(ck_step);
}

void Checkpointer::report_written(int64_t ck_step) {
  const double write_s = writer_->last_write_seconds();
  const double mib = double(writer_->last_bytes()) / (1024.0 * 1024.0);
  const std::string& io = writer_->last_io();
  if (say_ && !opt_.progress)
    std::fprintf(stderr, "train: checkpoint of step %lld written (%.1f MiB on rank 0 in %.2f s, %s)\n",
                 (long long)ck_step, mib, write_s, io.c_str());
  // Once per run even with the progress bar: a buffered fallback is slower, and the reason
  // (a file system without O_DIRECT, or the variable) is worth seeing.
  if (say_ && io != "direct" && !said_buffered_io_) {
    std::fprintf(stderr, "train: checkpoint arrays written through the page cache: %s\n", io.c_str());
    said_buffered_io_ = true;
  }
  metrics_.write({{"type", "checkpoint"}, {"step", ck_step}, {"rank0_write_s", write_s},
                  {"rank0_bytes", writer_->last_bytes()}, {"rank0_copy_s", writer_->last_copy_seconds()},
                  {"rank0_io", io}, {"dir", opt_.checkpoint_dir}});
}

// A failed rank says why; rank 0 says what happens next: the next checkpoint due tries again.
void Checkpointer::report_dropped(int64_t ck_step) {
  // The first line: the file and the OS reason (an HDF5 error stack follows it).
  const std::string& why = writer_->error();
  if (writer_->state() == CheckpointWriter::kFailed)
    std::fprintf(stderr, "[rank %d/%d %s] train: warning: checkpoint of step %lld failed: %s\n", comm_.rank(),
                 comm_.size(), world().host.c_str(), (long long)ck_step, why.substr(0, why.find('\n')).c_str());
  writer_->abandon();
  ++failures_;
  const int64_t next = next_checkpoint_step(ck_step, steps_, opt_.checkpoint_every);
  if (say_)
    std::fprintf(stderr, "%strain: warning: checkpoint of step %lld dropped; training goes on, %s\n",
                 opt_.progress ? "\n" : "", (long long)ck_step,
                 next > 0 ? strcat("the next checkpoint (step ", next, ") tries again").c_str()
                          : "and no checkpoint is due before the run ends");
  metrics_.write({{"type", "checkpoint_failed"}, {"step", ck_step}, {"next_try", next > 0 ? nlohmann::json(next) : nlohmann::json(nullptr)}});
}

}  // namespace lt
