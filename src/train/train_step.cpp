// One optimizer step, and the step's one small collective.
#include <algorithm>
#include <cmath>

#include "llamatrain/error.h"
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
  StepOutcome o;
  o.t_start = TrainClock::now();
  const DeviceCallCounts calls_before = m_.dev ? m_.dev->call_counts() : DeviceCallCounts{};
  // The collectives' volume: the device optimizer's on a device, the host's otherwise.
  const auto volume = [this] { return m_.dev ? m_.dev->comm_volume() : m_.zero.volume(); };
  const CommVolume comm_before = volume();
  if (m_.dev) {
    m_.dev->set_step(step + 1);
    m_.dev->zero_grads();
  } else if (m_.zero.sharded_grads()) {
    m_.zero.zero_shard_grads();
  } else {
    m_.model.zero_grads();
  }
  // Loss tokens of the whole global batch first, so every micro-batch on every rank is scaled by
  // 1/global count and the update is the same for any split of the step.
  o.loss_tokens = count_loss_tokens(train_, order_, epoch, s * global_batch_, global_batch_, T_);
  const float dloss = o.loss_tokens > 0 ? 1.0f / float(o.loss_tokens) : 0.0f;
  const int rank = comm_.rank();
  if (!m_.dev) m_.model.set_op_times(&o.ops);
  double loss_sum = forward_backward(epoch, s, first_micro_batch(split, rank), split[size_t(rank)], dloss,
                                     &o.compute_s);
  // Sharded gradients (ZeRO 2 and 3, CPU and device) are reduced per micro-batch: a rank with
  // fewer joins the others' rounds.
  if (m_.zero.stage() >= 2)
    for (int k = split[size_t(rank)]; k < *std::max_element(split.begin(), split.end()); ++k) {
      if (m_.dev) {
        m_.dev->zero_idle_forward();
        m_.dev->zero_idle_backward();
      } else {
        m_.zero.idle_forward();
        m_.zero.idle_backward();
      }
    }
  if (!m_.dev) m_.model.set_op_times(nullptr);
  // A checkpoint started after the last step copies the weights and moments in the background
  // while this step's passes ran; the update must not change them before that (on a device the
  // host copies change only at the next checkpoint, after its settle).
  ck.wait_snapshot();
  const auto t_opt = TrainClock::now();
  if (m_.dev) {
    o.grad_norm = m_.dev->zero_reduce_and_clip(grad_clip_);
    m_.dev->zero_step(lr, step + 1);
    loss_sum = m_.dev->take_loss_sum();  // the step's one read of its losses: waits for the update
    o.optimizer_s = seconds_since(t_opt);
  } else {
    // Null where this rank holds only its shard (ZeRO stages 2 and 3 on the CPU, zero.h).
    float* params = m_.zero.sharded_params() ? nullptr : m_.model.params().data();
    float* grads = m_.zero.sharded_grads() ? nullptr : m_.model.grads().data();
    m_.zero.reduce_gradients(grads);
    o.grad_norm = m_.zero.clip_gradients(grads, grad_clip_);
    m_.zero.step(params, grads, lr, step + 1);
    o.optimizer_s = seconds_since(t_opt);
  }
  o.loss_sum = comm_.allreduce_sum(loss_sum);
  o.loss = o.loss_tokens > 0 ? o.loss_sum / double(o.loss_tokens) : 0.0;
  // Loss and norm are global, so every rank stops here alike.
  if (!std::isfinite(o.loss) || !std::isfinite(o.grad_norm))
    throw CollectiveError(strcat("train: loss or gradient norm became non-finite at step ", step + 1, " (loss ",
                                 o.loss, ", grad_norm ", o.grad_norm, "); try a lower --lr"));
  if (m_.dev) o.device_calls = m_.dev->call_counts() - calls_before;
  else o.bf16_copy_peak_bytes = m_.model.bf16_copy_peak_bytes();
  const CommVolume v = volume();
  o.comm = {v.allreduce - comm_before.allreduce, v.reduce_scatter - comm_before.reduce_scatter,
            v.allgather - comm_before.allgather};
  return o;
}

// This rank's micro-batches [first_mb, first_mb + n_mb): a contiguous run of the step's global
// order. Returns their summed loss (0 on a device, where it stays until take_loss_sum());
// *compute_s receives the seconds they took.
double TrainStepper::forward_backward(int64_t epoch, int64_t s, int first_mb, int n_mb, float dloss,
                                      double* compute_s) {
  double loss_sum = 0;
  *compute_s = 0;
  const bool slow = comm_.rank() == slowdown_.rank && slowdown_.factor > 1;
  const bool sharded = !m_.dev && m_.zero.sharded_grads();
  for (int a = first_mb; a < first_mb + n_mb; ++a) {
    const auto t_mb = TrainClock::now();
    const double comm_before = sharded ? m_.zero.blocks().comm_seconds() : 0.0;
    rows_.clear();
    for (int i = 0; i < b_; ++i) rows_.push_back(order_.row(epoch, s * global_batch_ + int64_t(a) * b_ + i));
    mb_.fill(train_, rows_);
    if (m_.dev) {
      m_.dev->forward_deferred(mb_.batch());
      // The last micro-batch's backward also finishes the overlapped gradient reduction.
      if (a + 1 == first_mb + n_mb) {
        m_.dev->backward_last(mb_.batch(), dloss);
        m_.dev->finish_compute();  // the device's compute time, not the time to queue it
      } else {
        m_.dev->backward(mb_.batch(), dloss);
      }
    } else if (m_.zero.sharded_grads()) {
      loss_sum += m_.model.forward(mb_.batch(), m_.zero.blocks());
      m_.model.backward(mb_.batch(), dloss, m_.zero.blocks());
    } else {
      loss_sum += m_.model.forward(mb_.batch());
      m_.model.backward(mb_.batch(), dloss);
    }
    // Compute only: the ZeRO 2/3 collectives inside the passes (waits for slower ranks
    // included) are not this rank's speed, which --balance auto compares.
    double mb_s = seconds_since(t_mb) - (sharded ? m_.zero.blocks().comm_seconds() - comm_before : 0.0);
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
    *compute_s += mb_s;
  }
  return loss_sum;
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
