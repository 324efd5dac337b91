// Held-out loss: the masked loss summed over a whole split.
#include <algorithm>
#include <cmath>

#include "train/train_parts.h"

namespace lt {

namespace {

// Masked loss sum of a split (its first max_batches micro-batches when > 0), the micro-batches dealt
// round-robin over the ranks; forward is the model's forward on whichever device runs it. idle, when given, runs on a rank without a batch in
// the last round (ZeRO stage 3's gathers are collectives every rank joins).
template <class Forward>
double evaluate_split_with(Forward&& forward, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                           Comm& comm, const std::function<void(int64_t)>& on_batch = {},
                           const std::function<void()>& idle = {}, int64_t max_batches = 0) {
  double sums[2] = {0, 0};  // loss, loss tokens
  MicroBatch mb;
  std::vector<int64_t> rows;
  int64_t n_batches = (split.n_seq + batch_size - 1) / batch_size;
  if (max_batches > 0) n_batches = std::min(n_batches, max_batches);
  for (int64_t round = 0; round < n_batches; round += comm.size()) {
    const int64_t j = round + comm.rank();
    if (j >= n_batches) {
      if (idle) idle();
      continue;
    }
    if (on_batch) on_batch(j * batch_size);
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

double evaluate_split(Evaluator& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                      Comm& comm) {
  return evaluate_split_with([&](const Batch& b) { return model.forward(b); }, split, batch_size, loss_tokens, comm);
}

double evaluate_split(Evaluator& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                      const std::function<void(int64_t)>& on_batch) {
  return evaluate_split_with([&](const Batch& b) { return model.forward(b); }, split, batch_size, loss_tokens,
                             *make_self_comm(), on_batch);
}

double test_split_loss(TrainModel& m, const TokenSplit& test, int batch_size, int64_t max_batches, Comm& comm) {
  if (test.n_seq == 0) return NAN;
  int64_t tokens = 0;
  Engine& engine = *m.engine;
  const double sum = evaluate_split_with([&](const Batch& b) { return engine.forward(b); }, test, batch_size, &tokens,
                                         comm, {}, [&] { engine.idle_forward(); }, max_batches);
  return tokens > 0 ? sum / double(tokens) : NAN;
}

}  // namespace lt
