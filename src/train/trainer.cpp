// run_training: the training loop, in the phases of torchtitan's Trainer.train() and llm.c's
// main: setup and checks, resume, then epochs of steps, each followed by the checkpoint schedule
// and reporting, and an evaluation at every epoch end. Each phase is a part of train_parts.h.
#include "llamatrain/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/memory.h"
#include "llamatrain/model_io.h"
#include "llamatrain/peft_adapter.h"
#include "llamatrain/progress.h"
#include "llamatrain/runtime.h"
#include "llamatrain/zero_plan.h"
#include "train/train_parts.h"

namespace lt {

namespace {

// ZeRO 3 (and stages 1-2 on a device): no rank holds the whole weights, so they reach the file a
// tensor at a time, from each rank's shard on the host (a device copied its shard there first:
// gather_weights). LoRA at ZeRO 3: the frozen base's shards, each tensor with its adapter merged.
// Each tensor is all-gathered from the shards it overlaps into a buffer of its size, which rank 0
// hands to the writer (model_io.h ModelFileWriter) before the next: the most any rank holds is its
// shard and the largest tensor. Every rank takes part in every gather, whatever happened to the
// file, and then all learn rank 0's error, if any.
void stream_model_from_shards(const std::string& path, const ModelData& header, const TrainModel& m, Comm& comm,
                              bool quiet) {
  const FrozenShards* base = m.frozen_base.get();
  const ShardLayout& shards = base ? base->shards() : m.zero.shards();
  const std::vector<float>& mine = base ? base->params() : m.zero.shard_params();
  const size_t own_begin = base ? base->own_begin() : m.zero.own_begin();
  const size_t own_end = base ? base->own_end() : m.zero.own_end();
  std::unique_ptr<ModelFileWriter> writer;
  std::string error;
  auto attempt = [&](auto&& f) {
    if (comm.rank() != 0 || !error.empty()) return;
    try {
      f();
    } catch (const Error& e) {
      error = e.what();
      writer.reset();  // removes the temporary
    }
  };
  attempt([&] { writer = std::make_unique<ModelFileWriter>(path, header); });
  std::vector<float> tensor;
  for (const TensorInfo& t : m.model.layout().tensors()) {
    const size_t t0 = t.offset, t1 = t.offset + t.numel;
    tensor.assign(t.numel, 0.f);
    const std::vector<size_t> pieces = shards.pieces(t0, t1);
    const size_t lo = std::max(t0, own_begin), hi = std::min(t1, own_end);
    if (lo < hi) std::copy(mine.begin() + std::ptrdiff_t(lo - own_begin), mine.begin() + std::ptrdiff_t(hi - own_begin),
                           tensor.begin() + std::ptrdiff_t(lo - t0));
    if (comm.size() > 1)
      for_windows(pieces, kCommWindow, [&](size_t at, const std::vector<size_t>& n) {
        comm.allgather_v(tensor.data() + at, n, DType::kF32);
      });
    attempt([&] {
      if (base) merge_lora_tensor(*m.model.lora(), m.model.lora_params().data(), m.model.layout(), t0, tensor.data());
      writer->write_tensor(tensor.data());
    });
  }
  std::vector<float>().swap(tensor);
  attempt([&] { writer->finish(); });
  agree(comm, [&] {
    if (!error.empty()) fail(error);
  });
  if (comm.rank() == 0 && !quiet) std::fprintf(stderr, "train: wrote %s (streamed from the shards)\n", path.c_str());
}

// Models carry the dataset's tokenizer, so eval and generate need no --tokenizer, and the record of
// how they were trained. Rank 0 writes; the others learn whether it worked. ZeRO 3
// streams the tensors from the shards instead of gathering the whole weights.
void save_trained_model(const std::string& path, const TrainSetup& setup, const TrainModel& m, TrainingRecord record,
                        Comm& comm, bool quiet) {
  if (m.zero.sharded_params() || m.frozen_base) {
    ModelData header;
    header.config = setup.cfg;
    header.training = std::move(record);
    header.tokenizer_model = setup.ds.tokenizer_model;
    return stream_model_from_shards(path, header, m, comm, quiet);
  }
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    LT_CHECK(m.model.params().size() >= m.n_params, "the whole weights are not on rank 0");
    ModelData out;
    out.config = setup.cfg;
    out.training = std::move(record);
    out.params.assign(m.model.params().begin(), m.model.params().begin() + std::ptrdiff_t(m.n_params));
    // LoRA: the model file is the base with the adapters merged (eval and generate need nothing
    // else); the adapters alone go to DIR/adapter (save_final_model).
    if (const LoraLayout* lora = m.model.lora())
      merge_lora(*lora, m.model.lora_params().data(), m.model.layout(), out.params.data());
    out.tokenizer_model = setup.ds.tokenizer_model;
    save_model_hdf5(path, out);
    if (!quiet) std::fprintf(stderr, "train: wrote %s\n", path.c_str());
  });
}

// LoRA: the trained adapters as a PEFT adapter directory (peft_adapter.h; DIR/adapter, and with
// --keep-best DIR/best-adapter), for the HF export of the base (convert --input BASE --output
// HF_DIR) or for eval/generate --lora.
void save_adapter(const std::string& dir, const TrainOptions& opt, const TrainModel& m, Comm& comm, bool quiet) {
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    const std::string base = opt.init_from.empty() ? "llamatrain --model-config " + opt.model_config : opt.init_from;
    write_peft_adapter(dir, m.model.config(), *m.model.lora(), m.model.lora_params().data(), base);
    if (!quiet) std::fprintf(stderr, "train: wrote %s (PEFT LoRA adapter)\n", dir.c_str());
  });
}

// --keep-best: the lowest --eval-every test loss of the run so far (carried over a resume by the
// checkpoints' best_eval_step and best_eval_loss) and, for each new one, its weights kept at once:
// <output>/best.h5 here, and the checkpoint of that step, which the loop writes and which marks
// itself as DIR/best when published (checkpoint.h).
class BestKeeper {
 public:
  BestKeeper(const TrainOptions& opt, const TrainSetup& setup, const RunIdentity& run, const ResumePoint& resumed,
             Comm& comm, MetricsWriter& metrics, bool say)
      : opt_(opt), setup_(setup), run_(run), comm_(comm), metrics_(metrics), say_(say),
        step_(opt.keep_best ? resumed.best_eval_step : -1), loss_(resumed.best_eval_loss) {}
  // Whether `loss` after `steps_done` steps is a new best (strictly below the best so far; the
  // first evaluation always is); a new best's weights are written now (a collective).
  bool offer(int64_t steps_done, double loss, double train_loss, TrainModel& m);
  // What a checkpoint records of it.
  void record(CheckpointInfo& ci) const { ci.best_eval_step = step_, ci.best_eval_loss = loss_; }

 private:
  const TrainOptions& opt_;
  const TrainSetup& setup_;
  const RunIdentity& run_;
  Comm& comm_;
  MetricsWriter& metrics_;
  bool say_;
  int64_t step_;  // -1: no best yet
  double loss_;
};

bool BestKeeper::offer(int64_t steps_done, double loss, double train_loss, TrainModel& m) {
  if (!opt_.keep_best) return false;
  comm_.broadcast(&loss, sizeof loss, 0);  // every rank decides alike, whatever the all-reduce's rounding
  if (!std::isfinite(loss) || (step_ >= 0 && !(loss < loss_))) return false;
  step_ = steps_done, loss_ = loss;
  std::string kept = opt_.checkpoint_dir.empty() || opt_.checkpoint_on_stop_only ? "" : opt_.checkpoint_dir + "/best";
  if (!opt_.output.empty()) {
    const std::string path = opt_.output + "/best.h5";
    m.engine->gather_weights();
    try {
      save_trained_model(path, setup_, m, training_record(opt_, setup_, run_, comm_.size(), steps_done, train_loss, loss),
                         comm_, /*quiet=*/true);
      kept += strcat(kept.empty() ? "" : " and ", path);
      if (m.model.lora()) {  // the adapters alone too
        save_adapter(opt_.output + "/best-adapter", opt_, m, comm_, /*quiet=*/true);
        kept += strcat(" and ", opt_.output, "/best-adapter");
      }
    } catch (const CollectiveError& e) {
      // Like a dropped checkpoint: training goes on, and the next new best tries again.
      if (say_) std::fprintf(stderr, "%strain: warning: %s\n", opt_.progress ? "\n" : "", e.what());
    }
  }
  metrics_.write({{"type", "best"}, {"step", steps_done}, {"test_loss", loss}, {"unix_time_s", unix_time_s()}});
  if (say_ && !opt_.progress)
    std::fprintf(stderr, "train: step %lld: the best test loss so far%s%s\n", (long long)steps_done,
                 kept.empty() ? "" : ", kept in ", kept.c_str());
  return true;
}

// A rerun of a finished run (a Slurm requeue after the last step, say): the newest checkpoint is
// at the last step, so there is nothing to train; the final model is left as it is, or written
// from the checkpoint when the run died before writing it.
TrainResult already_complete(TrainResult result, const TrainOptions& opt, const TrainSetup& setup,
                             const RunIdentity& run, TrainModel& m, Comm& comm, bool say) {
  result.already_complete = true;
  result.steps = result.start_step;
  if (say)
    std::fprintf(stderr, "train: %s is at step %lld of %lld: the run is already complete, nothing to train\n",
                 result.resumed_from.c_str(), (long long)result.steps, (long long)setup.steps.total_steps);
  if (opt.output.empty()) return result;
  result.model_path = opt.output + "/model.h5";
  bool missing = false;
  if (comm.rank() == 0) missing = !file_exists(result.model_path);
  comm.broadcast(&missing, sizeof missing, 0);
  if (missing) {
    const TrainingRecord record = training_record(opt, setup, run, comm.size(), result.steps, NAN, NAN);
    save_trained_model(result.model_path, setup, m, record, comm, opt.quiet);
    if (m.model.lora()) save_adapter(opt.output + "/adapter", opt, m, comm, opt.quiet);
  }
  else if (say) std::fprintf(stderr, "train: %s left as it is\n", result.model_path.c_str());
  return result;
}

// The final model, written unless the run stopped on a signal; false (said on rank 0) when it
// could not be written.
bool save_final_model(TrainResult& result, const TrainOptions& opt, const TrainSetup& setup, const RunIdentity& run,
                      TrainModel& m, Comm& comm) {
  if (opt.output.empty() || result.stopped_by_signal) return true;
  // A device holds each rank's range of the master weights: gather them (ZeRO 3 streams them
  // from the shards instead: save_trained_model).
  m.engine->gather_weights();
  result.model_path = opt.output + "/model.h5";
  const double test_loss = result.test_loss >= 0 ? result.test_loss : NAN;
  const TrainingRecord record = training_record(opt, setup, run, comm.size(), result.steps, result.last_loss, test_loss);
  try {
    save_trained_model(result.model_path, setup, m, record, comm, opt.quiet);
    if (m.model.lora()) save_adapter(opt.output + "/adapter", opt, m, comm, opt.quiet);
  } catch (const CollectiveError& e) {
    if (comm.rank() == 0) std::fprintf(stderr, "train: error: %s\n", e.what());
    return false;
  }
  return true;
}

// What of the final state was not saved and where the newest saved state is (rank 0).
std::string lost_state_report(const TrainResult& result, const TrainOptions& opt, bool ckpt_saved, bool model_saved,
                              const Checkpointer& ckpt) {
  const std::string newest = ckpt.newest();
  std::string lost = ckpt_saved ? "" : strcat("its checkpoint in ", opt.checkpoint_dir, " could not be written");
  if (!model_saved) lost += strcat(lost.empty() ? "" : " and ", result.model_path, " could not be written");
  std::string saved;
  if (!newest.empty()) {
    const std::string name = std::filesystem::path(newest).filename().string();  // step-<8 digits>
    saved = strcat("the checkpoint ", newest, " (step ", std::atoll(name.c_str() + 5), ")");
  }
  if (!newest.empty() && !model_saved)
    saved += strcat(" (`llamatrain convert --input ", newest, " --output model.h5` makes a model of it)");
  if (model_saved && !result.model_path.empty())
    saved += strcat(saved.empty() ? "" : "; ", result.model_path, " holds the final weights (no optimizer state)");
  return strcat("train: error: the state after step ", result.steps, " was not saved: ", lost,
                ". Newest saved state: ", saved.empty() ? "none, nothing of this run was saved" : saved, " (exit status ",
                kExitStateNotSaved, ")");
}

// A completed run whose checkpoints went to --output's default directory only on a stop: the
// final model supersedes them, and a rerun of the same command must start afresh, not resume.
void remove_stop_checkpoints(const TrainOptions& opt, Comm& comm, bool say) {
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    std::error_code ec;
    const bool had = !list_checkpoints(opt.checkpoint_dir).empty();
    std::filesystem::remove_all(opt.checkpoint_dir, ec);
    if (say && had) std::fprintf(stderr, "train: run complete; its stop checkpoint in %s removed\n", opt.checkpoint_dir.c_str());
  });
}

// What the steps' evaluations and checkpoints share, and the latest --eval-every evaluation.
struct StepEnds {
  const TrainOptions& opt;
  const TrainSetup& setup;
  TrainModel& m;
  Comm& comm;
  const RunIdentity& run;
  MetricsWriter& metrics;
  Checkpointer& ckpt;
  BestKeeper& best;
  bool say;
  int64_t eval_step = -1;  // the latest --eval-every evaluation: after eval_step steps, eval_loss
  double eval_loss = NAN;

  // --eval-every after `done` steps, before the step's checkpoint, which records the loss (not on
  // a stop signal: the checkpoint then comes first); --keep-best keeps a new best at once (*new_best).
  // The seconds it took, not counted as training time (0 when not due).
  double evaluate_if_due(int64_t done, int64_t epoch, double train_loss, bool stop, bool* new_best) {
    *new_best = false;
    if (opt.eval_every <= 0 || done % opt.eval_every != 0 || stop) return 0;
    const auto t_eval = TrainClock::now();
    eval_loss = test_split_loss(m, setup.ds.test, opt.batch_size, opt.eval_batches, comm);
    eval_step = done;
    const double seconds = seconds_since(t_eval);
    report_eval(eval_step, epoch, eval_loss, seconds, metrics, say && !opt.progress);
    *new_best = best.offer(eval_step, eval_loss, train_loss, m);
    return seconds;
  }
  // Checkpoints after `done` steps: publish the one in flight once every rank has written its
  // part; start one when due (checkpoint_due, or a new best), and on a stop signal write it, wait,
  // and return true: the run stops.
  bool checkpoint(int64_t done, const StepSync& sync, const std::vector<int>& split, double loss, bool new_best) {
    if (!ckpt.enabled()) return false;
    ckpt.poll(sync.writer_states);
    const StepCounts& sc = setup.steps;
    if (opt.checkpoint_on_stop_only ? sync.stop : checkpoint_due(done, sc, opt.checkpoint_every, sync.stop) || new_best) {
      CheckpointInfo ci = checkpoint_info(opt, setup, run, comm.size(), done, split, loss, eval_loss);
      best.record(ci);
      ckpt.start(ci, m, setup.ds.tokenizer_model);
    }
    if (!sync.stop) return false;
    ckpt.settle(true);
    return true;
  }
};

// The end of a run after `step` steps, its last checkpoint published: the final model written (or
// a distinct exit status and what was lost: lost_state_report), the stop checkpoints of a
// --checkpoint-on-stop-only run removed once the model is safe.
void finish_run(TrainResult& result, StepEnds& e, int64_t step) {
  const TrainOptions& opt = e.opt;
  const bool say = e.say, rank0 = e.comm.rank() == 0;
  // A stop-only checkpoint directory holds nothing unless the run stopped.
  const bool ckpt_saved = e.ckpt.published(step) || (opt.checkpoint_on_stop_only && !result.stopped_by_signal);
  if (say && result.stopped_by_signal && ckpt_saved)
    std::fprintf(stderr, "%strain: stop signal: checkpoint of step %lld written to %s; %s\n", opt.progress ? "\n" : "",
                 (long long)step, opt.checkpoint_dir.c_str(),
                 opt.checkpoint_on_stop_only ? "run the same command again to continue" : "resume with --resume auto");
  const auto t_model = TrainClock::now();
  const bool model_saved = save_final_model(result, opt, e.setup, e.run, e.m, e.comm);
  // Rank 0's peak resident memory after the final model was written: with ZeRO 3 the tensors are
  // streamed from the shards, so writing adds one tensor, not the whole weights.
  if (rank0 && model_saved && !result.model_path.empty())
    e.metrics.write({{"type", "model"}, {"path", result.model_path}, {"seconds", seconds_since(t_model)},
                     {"host_peak_rss_bytes", host_peak_rss_bytes()}});
  result.state_not_saved = !ckpt_saved || !model_saved;
  if (opt.checkpoint_on_stop_only && !result.stopped_by_signal && model_saved) remove_stop_checkpoints(opt, e.comm, say);
  if (rank0 && result.state_not_saved) result.state_report = lost_state_report(result, opt, ckpt_saved, model_saved, e.ckpt);
  result.metrics_lost = e.metrics.report_lost(say);
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
  if (!opt.checkpoint_dir.empty()) install_stop_handlers();

  // ---- setup: options, data, model, optimizer, device, balance, schedule ---------------------
  TrainSetup setup = check_training_setup(opt, comm);
  if (say && opt.checkpoint_dir.empty())
    std::fprintf(stderr, "train: note: a stop (Ctrl-C, SIGTERM) will lose this run: %s\n",
                 opt.output.empty() ? "--checkpoint-dir DIR (or --output DIR) keeps it"
                                    : "its ranks span several hosts; --checkpoint-dir DIR on a shared file system keeps it");
  struct TraceEnd {
    ~TraceEnd() { stop_zero_trace(); }
  } trace_end;
  if (!opt.trace_collectives.empty()) start_zero_trace(strcat(opt.trace_collectives, ".", rank));
  TrainModel m(setup, opt, comm, say);
  const RankDevices devices = gather_rank_devices(m.engine->info(), comm);
  if (setup.device == DeviceKind::cuda && setup.balance == BalanceMode::kAuto && opt.rank_weights.empty())
    setup.weights = devices.gemm_tflops();
  const StepCounts& sc = setup.steps;
  const int T = setup.seq_len();
  std::vector<int> split =
      split_by_weights(int(setup.micro_batches), setup.weights, setup.balance == BalanceMode::kAuto ? 1 : 0);
  const LrSchedule sched{opt.lr, opt.min_lr, opt.warmup_steps, sc.total_steps};
  DataOrder order(setup.ds.train.n_seq, opt.seed, opt.shuffle);

  // ---- resume --------------------------------------------------------------------------------
  TrainResult result;
  const RunIdentity run = run_identity(setup, opt, comm);
  const ResumePoint resumed = resume_training(opt, run, setup.micro_batches, m, comm, say);
  int64_t step = resumed.step;
  result.start_step = step;
  result.resumed_from = resumed.path;
  if (!resumed.split.empty()) split = resumed.split;
  if (step == sc.total_steps) return already_complete(result, opt, setup, run, m, comm, say);
  if (step > sc.total_steps)
    throw CollectiveError(strcat("train: ", result.resumed_from, " is at step ", step, ", the run has ", sc.total_steps,
                                 " steps: nothing left to do (raise --epochs or --max-steps to continue)"));
  if (say && !resumed.path.empty())
    if (const std::string note = schedule_change(resumed.schedule, sched, step); !note.empty())
      std::fprintf(stderr, "%s\n", note.c_str());

  // ---- checkpoints, metrics, the start-of-run report ------------------------------------------
  MetricsWriter metrics;
  Checkpointer ckpt(opt, sc, m.zero.shards(), comm, metrics, say);
  agree(comm, [&] {
    if (rank0) metrics.open(opt.metrics, step > 0);
  });
  report_start(opt, setup, m, devices, split, W, metrics, say);
  if (opt.save_init) {
    if (opt.output.empty()) throw CollectiveError("train: --save-init needs --output DIR");
    save_trained_model(opt.output + "/init.h5", setup, m, training_record(opt, setup, run, W, step, NAN, NAN), comm,
                       opt.quiet);
  }
  m.engine->load_host_state();  // after a resume, too

  // ---- the loop: epochs of steps ---------------------------------------------------------------
  const auto t_start = TrainClock::now();
  TrainStepper stepper(m, setup, opt, order, comm);
  AutoBalancer balancer(W, opt.rebalance_every);
  bool stopping = false;
  BestKeeper best(opt, setup, run, resumed, comm, metrics, say);
  StepEnds ends{opt, setup, m, comm, run, metrics, ckpt, best, say};
  RunLosses losses;  // this run's steps: the progress line's loss and the means it ends with
  const int64_t start_epoch = sc.epoch_of(step);
  for (int64_t epoch = start_epoch; epoch < sc.n_epochs && step < sc.total_steps && !stopping; ++epoch) {
    const auto t_epoch = TrainClock::now();
    const int64_t s0 = epoch == start_epoch ? step % sc.steps_per_epoch : 0;  // mid-epoch after a resume
    // One bar per epoch ("epoch 2/3 [###..] 40% 12/30 steps ... eta"); the extra text carries the
    // loss, the throughput, the slowest rank and, for multi-epoch runs, the ETA of the whole run.
    EpochSummary es;
    double eval_s = 0;  // this epoch's --eval-every evaluations, not counted as training time
    es.epoch = epoch;
    es.steps = std::min(sc.steps_per_epoch - s0, sc.total_steps - step);
    Progress progress(strcat("epoch ", epoch + 1, "/", sc.n_epochs), es.steps, "steps",
                      opt.progress && rank0 ? 0.0 : 1e30);
    for (int64_t s = s0; s < sc.steps_per_epoch && step < sc.total_steps; ++s, ++step) {
      const float lr = sched.at(step);
      const StepOutcome o = stepper.run(epoch, s, step, split, lr, ckpt);
      const StepSync sync = gather_step_times(comm, o.compute_s, seconds_since(o.t_start), ckpt.state(), stop_signal(),
                                              o.device_calls);
      const double step_s = seconds_since(o.t_start);
      result.last_loss = o.loss;
      losses.add(o.loss_sum, o.loss_tokens);
      es.loss_sum += o.loss_sum;
      es.loss_tokens += o.loss_tokens;
      metrics.write(step_record(step, epoch, lr, o, step_s, sync, split, setup, opt.batch_size, devices,
                                m.engine->memory_use(), ckpt.enabled()));

      if (setup.balance == BalanceMode::kAuto && W > 1)
        if (const auto d = balancer.observe(step, sync.times.compute, split); d && d->rebalance.take) {
          report_rebalance(step, split, *d, metrics, say, opt.progress);
          split = d->rebalance.split;
        }

      bool new_best = false;
      eval_s += ends.evaluate_if_due(step + 1, epoch, o.loss, sync.stop, &new_best);
      if (ends.checkpoint(step + 1, sync, split, o.loss, new_best)) {
        result.stopped_by_signal = true;
        stopping = true;
        ++step;
        break;
      }

      // At the rate of this run's own steps: after a resume, step + 1 counts steps it did not run.
      const double eta_s = run_eta_s(seconds_since(t_start), step + 1 - resumed.step, sc.total_steps - step - 1);
      progress.update(s + 1 - s0, progress_text(losses.recent(), ends.eval_loss, double(setup.global_batch * T) / step_s,
                                                sync.times, W, sc.n_epochs, eta_s));
    }
    if (stopping) break;
    es.seconds = seconds_since(t_epoch) - eval_s;
    es.step = step;
    es.steps_per_epoch = sc.steps_per_epoch;
    es.complete = step % sc.steps_per_epoch == 0;  // else the run's step limit came first
    // The epoch's last step may just have been evaluated (--eval-every).
    es.test_loss = ends.eval_step == step ? ends.eval_loss
                                          : test_split_loss(m, setup.ds.test, opt.batch_size, opt.eval_batches, comm);
    result.test_loss = std::isfinite(es.test_loss) ? es.test_loss : -1;
    progress.finish();
    report_epoch(es, setup, split, W, metrics, say);
  }
  ckpt.settle(true);
  ckpt.wait();  // rank 0's publication
  result.steps = step;
  const LossEnds loss_ends = losses.ends();
  result.first_window_loss = loss_ends.first, result.last_window_loss = loss_ends.last;
  result.window_steps = loss_ends.steps;
  result.split = split;
  result.seconds = seconds_since(t_start);
  finish_run(result, ends, step);
  return result;
}

}  // namespace lt
