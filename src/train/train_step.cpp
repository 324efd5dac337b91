// One optimizer step, and the step's one small collective.
#include <algorithm>
#include <cmath>

#include "llamatrain/error.h"
#include "llamatrain/zero_plan.h"
#include "train/train_parts.h"

namespace lt {

int first_micro_batch(const std::vector<int>& split, int rank) {
  int first = 0;
  for (int r = 0; r < rank; ++r) first += split[size_t(r)];
  return first;
}

int64_t count_loss_tokens(const TokenSplit& split, DataOrder& order, int64_t epoch, int64_t first, int64_t n, int T) {
  int64_t tokens = 0;
  for (int64_t i = first; i < first + n; ++i) {
    const uint8_t* m = split.row_mask(order.row(epoch, i));
    for (int t = 1; t <= T; ++t) tokens += m[t];
  }
  return tokens;
}

TrainStepper::TrainStepper(TrainModel& m, const TrainSetup& setup, const TrainOptions& opt, DataOrder& order,
                           Comm& comm)
    : m_(m),
      train_(setup.ds.train),
      order_(order),
      comm_(comm),
      b_(opt.batch_size),
      T_(setup.seq_len()),
      global_batch_(setup.global_batch),
      grad_clip_(opt.grad_clip),
      slowdown_(setup.slowdown) {}

StepOutcome TrainStepper::run(int64_t epoch, int64_t s, int64_t step, const std::vector<int>& split, float lr,
                              Checkpointer& ck) {
  Engine& engine = *m_.engine;
  StepOutcome o;
  o.t_start = TrainClock::now();
  const EngineCounters before = engine.counters();
  const int rounds = *std::max_element(split.begin(), split.end());
  zero_trace_note(strcat("step ", step + 1, " rounds ", rounds));
  engine.begin_step(step + 1);
  // Loss tokens of the whole global batch first, so every micro-batch on every rank is scaled by
  // 1/global count and the update is the same for any split of the step.
  o.loss_tokens = count_loss_tokens(train_, order_, epoch, s * global_batch_, global_batch_, T_);
  const float dloss = o.loss_tokens > 0 ? 1.0f / float(o.loss_tokens) : 0.0f;
  const int rank = comm_.rank();
  engine.set_op_times(&o.ops);
  o.compute_s = forward_backward(epoch, s, first_micro_batch(split, rank), split[size_t(rank)], dloss);
  // A rank with fewer micro-batches joins the others' rounds (their collectives, where the ZeRO
  // stage reduces gradients inside the passes).
  for (int k = split[size_t(rank)]; k < rounds; ++k) engine.idle_round();
  engine.set_op_times(nullptr);
  // A checkpoint started after the last step copies the weights and moments in the background
  // while this step's passes ran; the update must not change them before that (on a device the
  // host copies change only at the next checkpoint, after its settle).
  ck.wait_snapshot();
  const auto t_opt = TrainClock::now();
  const StepResult r = engine.finish_step(lr, grad_clip_, step + 1);
  zero_trace_note(strcat("after step ", step + 1));
  o.optimizer_s = seconds_since(t_opt);
  o.grad_norm = r.grad_norm;
  o.loss_sum = comm_.allreduce_sum(r.loss_sum);
  o.loss = o.loss_tokens > 0 ? o.loss_sum / double(o.loss_tokens) : 0.0;
  // Loss and norm are global, so every rank stops here alike.
  if (!std::isfinite(o.loss) || !std::isfinite(o.grad_norm))
    throw CollectiveError(strcat("train: loss or gradient norm became non-finite at step ", step + 1, " (loss ",
                                 o.loss, ", grad_norm ", o.grad_norm, "); try a lower --lr"));
  const EngineCounters after = engine.counters();
  o.device_calls = after.device_calls - before.device_calls;
  o.bf16_copy_peak_bytes = engine.bf16_copy_peak_bytes();
  o.comm = {after.comm.allreduce - before.comm.allreduce, after.comm.reduce_scatter - before.comm.reduce_scatter,
            after.comm.allgather - before.comm.allgather};
  return o;
}

// This rank's micro-batches [first_mb, first_mb + n_mb): a contiguous run of the step's global
// order. Returns the seconds they took computing.
double TrainStepper::forward_backward(int64_t epoch, int64_t s, int first_mb, int n_mb, float dloss) {
  double compute_s = 0;
  const bool slow = comm_.rank() == slowdown_.rank && slowdown_.factor > 1;
  for (int a = first_mb; a < first_mb + n_mb; ++a) {
    const auto t_mb = TrainClock::now();
    const double comm_before = m_.engine->counters().pass_comm_s;
    rows_.clear();
    for (int i = 0; i < b_; ++i) rows_.push_back(order_.row(epoch, s * global_batch_ + int64_t(a) * b_ + i));
    mb_.fill(train_, rows_);
    m_.engine->forward_backward(mb_.batch(), dloss, a + 1 == first_mb + n_mb);
    // Compute only: the collectives inside the passes (waits for slower ranks included) are not
    // this rank's speed, which --balance auto compares.
    double mb_s = seconds_since(t_mb) - (m_.engine->counters().pass_comm_s - comm_before);
    if (slow) {
      // Busy-wait, not sleep: a slower device stays busy, and a sleeping vCPU wakes late and
      // cold, which would make the simulated rank's timing noisy.
      const auto t_wait = TrainClock::now();
      const auto until = t_wait + std::chrono::duration_cast<TrainClock::duration>(
                                      std::chrono::duration<double>(mb_s * (slowdown_.factor - 1)));
      while (TrainClock::now() < until) {
      }
      mb_s += seconds_since(t_wait);
    }
    compute_s += mb_s;
  }
  return compute_s;
}

StepSync gather_step_times(Comm& comm, double compute_s, double step_s, int writer_state, int signal,
                           const DeviceCallCounts& device_calls) {
  std::vector<double> mine = {compute_s, step_s, double(writer_state), double(signal)};
  for (double v : device_calls.values()) mine.push_back(v);
  const size_t k = mine.size();  // values per rank
  const std::vector<double> all = comm.allgather_values(mine);
  StepSync s;
  StepTimes& t = s.times;
  double sum = 0, worst = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const double* v = &all[size_t(r) * k];
    t.compute.push_back(v[0]);
    t.wait.push_back(std::max(0.0, v[1] - v[0]));
    s.writer_states.push_back(int(v[2]));
    if (v[3] != 0) s.stop = true;
    s.device_calls.push_back(DeviceCallCounts::from_values(v + 4));
    sum += t.compute.back();
    if (t.compute.back() > worst) worst = t.compute.back(), t.slowest = r;
  }
  t.balance = worst > 0 ? sum / comm.size() / worst : 1.0;
  return s;
}

}  // namespace lt
