// ZeRO planned once (DESIGN.md "Distributed training", issue 34): the cut of the flat parameter
// buffer into ranks' shards, the gradient buckets, and the ordered list of every collective one
// optimizer step issues, for a model's layout, a rank count, a stage and a number of micro-batch
// rounds. Both engines' ZeRO (the host's, zero.h and zero_blocks.h; the device's,
// src/backend/cuda/device_zero.h) take their shards and buckets from a ZeroPlan and issue their
// collectives through a ZeroComm (below): MPI on host buffers, NCCL or the simulator's communicator on
// device buffers. A ZeroComm can trace what it issues, and tests/mpi/test_zero_plan_mpi.cpp checks
// that each engine issued exactly plan.step_calls(rounds), in that order, on 1-4 ranks.
//
// A step's collectives (world > 1; one rank issues none):
//  stage 0  after the rounds, each gradient bucket all-reduced, from the top bucket down;
//  stage 1  each bucket reduce-scattered (each owner's piece summed to its owner), top down; the
//           sum of squares of the shards all-reduced (the clipping norm); after the update, each
//           parameter block's weights all-gathered, in forward order;
//  stage 2  every round: each block's gradients reduce-scattered as the backward finishes it (the
//           order of grads_done in llama2_pass.h); then the norm and the gathers as stage 1;
//  stage 3  every round: as stage 2, and each block's weights gathered before the pass uses it
//           (at acquire, or with prefetch when the pass names it as the next one); then the norm.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "llamatrain/comm_wait.h"
#include "llamatrain/model.h"

namespace lt {

// The flat vector of N parameters is padded to P = ceil(N / W) * W and cut into W equal contiguous
// shards of S = P / W; rank r owns [r S, (r+1) S) (the padding, at the end of the last shard, is
// zero and never updated).
struct ShardLayout {
  size_t n = 0;       // parameters
  int world = 1;
  size_t padded = 0;  // multiple of world
  size_t shard = 0;   // padded / world
  ShardLayout(size_t n_params, int world_size);
  // This rank's real elements: [begin(r), end(r)) within [0, n).
  size_t begin(int r) const;
  size_t end(int r) const;
  // Elements of the flat range [b, e) in each rank's shard (zeros for the ranks it does not
  // reach): the counts of allgather_v / reduce_scatter_v_sum over a block or a tensor.
  std::vector<size_t> pieces(size_t b, size_t e) const;
};

// Bytes this rank sent through the ZeRO collectives, as a ring implementation moves them: an
// all-reduce of n bytes 2 n (W-1)/W, a reduce-scatter or all-gather of n bytes n (W-1)/W.
struct CommVolume {
  double allreduce = 0, reduce_scatter = 0, allgather = 0;
  double total() const { return allreduce + reduce_scatter + allgather; }
  CommVolume& operator+=(const CommVolume& o) {
    allreduce += o.allreduce, reduce_scatter += o.reduce_scatter, allgather += o.allgather;
    return *this;
  }
};
// The ring volume of a reduce-scatter or all-gather over `bytes` in all.
inline double ring_bytes(double bytes, int world) { return bytes * double(world - 1) / double(world); }

// The host's ZeRO collectives move at most this many elements per MPI call (4 MiB of fp32), so
// that the scratch MPI allocates for one call (a large all-reduce's temporary buffers) stays
// bounded, as DeepSpeed's bucket sizes bound it.
constexpr size_t kCommWindow = size_t(1) << 20;

// Calls f(offset, counts) for consecutive windows of at most `window` elements over pieces laid
// back to back (piece r of pieces[r] elements): counts[r] is piece r's part of the window that
// starts at element offset (the window's pieces are again back to back there).
template <class F>
void for_windows(const std::vector<size_t>& pieces, size_t window, F&& f) {
  size_t total = 0;
  for (size_t p : pieces) total += p;
  std::vector<size_t> counts(pieces.size());
  for (size_t w0 = 0; w0 < total; w0 += window) {
    const size_t w1 = std::min(total, w0 + window);
    size_t at = 0;
    for (size_t r = 0; r < pieces.size(); ++r) {
      const size_t lo = std::max(at, w0), hi = std::min(at + pieces[r], w1);
      counts[r] = lo < hi ? hi - lo : 0;
      at += pieces[r];
    }
    f(w0, counts);
  }
}

// The gradient buckets of stages 0 and 1: bounds[k] .. bounds[k + 1] is bucket k, ascending from
// 0 to `padded` (the padding past the last block goes with the top bucket). From the top block
// down, a bucket takes whole blocks until it holds at least bucket_bytes of fp32 gradients; 0
// gives one bucket per block. first_block[k] is bucket k's lowest block.
struct GradientBuckets {
  std::vector<size_t> bounds;
  std::vector<int> first_block;
  size_t size() const { return first_block.size(); }
};
GradientBuckets gradient_buckets(const ParameterLayout& layout, size_t padded, size_t bucket_bytes);

// One collective of a ZeRO step over the flat range [begin, end) (none for kNormSum: one double).
enum class ZeroOp { kAllReduce, kReduceScatter, kAllGather, kNormSum };
const char* zero_op_name(ZeroOp op);  // "all-reduce", "reduce-scatter", "all-gather", "norm-sum"
struct ZeroCall {
  ZeroOp op = ZeroOp::kNormSum;
  size_t begin = 0, end = 0;
  bool operator==(const ZeroCall& o) const { return op == o.op && begin == o.begin && end == o.end; }
  bool operator!=(const ZeroCall& o) const { return !(*this == o); }
  std::string text() const;  // "reduce-scatter [0, 1024)", "norm-sum"
};

struct ZeroPlanOptions {
  size_t bucket_bytes = kDefaultBucketMiB << 20;  // train --bucket-mb
  // Stage 3: a block's gather is issued when the pass names it as the next one (prefetch; the
  // device's --zero3-prefetch 1, so that it runs under the current block's compute), else at its
  // acquire (the CPU, whose collectives block).
  bool prefetch = false;
  // LoRA's frozen base at stage 3: gathers only, no gradient.
  bool frozen = false;
};

class ZeroPlan {
 public:
  // Over a model's layout (its blocks: the embedding, each layer, the final norm with the head).
  ZeroPlan(const ParameterLayout& layout, int world, int stage, const ZeroPlanOptions& options = {});
  // Over a flat table of `total` values that is not a model's (LoRA's adapters): one block, stages
  // 0 and 1.
  ZeroPlan(size_t total, int world, int stage, const ZeroPlanOptions& options = {});

  int stage() const { return stage_; }
  int world() const { return shards_.world; }
  const ShardLayout& shards() const { return shards_; }
  const GradientBuckets& buckets() const { return buckets_; }
  const ZeroPlanOptions& options() const { return options_; }
  // The parameter blocks' flat ranges, in forward order.
  const std::vector<ParameterLayout::Block>& blocks() const { return blocks_; }

  // The collectives of one micro-batch round, forward and backward (stages 2 and 3; a rank without
  // a micro-batch joins them with zero gradients), of one forward-only round (stage 3's gathers,
  // evaluation), and of the update after the rounds.
  std::vector<ZeroCall> round_calls() const;
  std::vector<ZeroCall> forward_calls() const;
  std::vector<ZeroCall> update_calls() const;
  // Everything one optimizer step of `rounds` micro-batch rounds issues, in order.
  std::vector<ZeroCall> step_calls(int rounds) const;
  // Stages 1 and 2: the working copy gathered block by block (update_calls' tail; also what a
  // device issues at start, where the host holds only its shard).
  std::vector<ZeroCall> gather_calls() const;
  // Names in fault reports: "layer 3", "the embedding" (a block); "layers 0-2", "layer 5 and the
  // final norm and output head" (a gradient bucket); "the table" over a flat table.
  std::string block_name(int b) const;
  std::string bucket_name(size_t k) const;

 private:
  std::vector<ZeroCall> walk_blocks(bool backward) const;
  int stage_;
  ShardLayout shards_;
  ZeroPlanOptions options_;
  const ParameterLayout* layout_;  // null over a flat table
  std::vector<ParameterLayout::Block> blocks_;
  GradientBuckets buckets_;
};

// What an engine's ZeRO issues its collectives through, one implementation per kind of buffer
// (HostZeroComm in zero_blocks.h over lt::Comm; the device's over its DeviceComm). The public
// calls record each collective in the process's trace (start_zero_trace) and then run it, so
// nothing an engine's ZeRO issues escapes the trace. Made for world > 1 only.
class ZeroComm {
 public:
  ZeroComm(const ShardLayout& shards, int rank) : shards_(shards), rank_(rank) {}
  virtual ~ZeroComm() = default;
  ZeroComm(const ZeroComm&) = delete;
  ZeroComm& operator=(const ZeroComm&) = delete;
  const ShardLayout& shards() const { return shards_; }
  int rank() const { return rank_; }
  // Sums the ranks' fp32 gradients over [begin, end) (buf: element 0 at flat offset begin):
  // kAllReduce leaves the sum in all of buf, kReduceScatter in this rank's piece (the rest is left
  // unspecified). They cross the wire in the implementation's wire dtype (fp32, or bf16: rounded
  // to nearest, and widened back). `what` names them in fault reports: "gradients of layer 3".
  void reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& what);
  // Every owner's piece of [begin, end) to every rank (buf: the engine's weights, element 0 at flat
  // offset begin, this rank's piece already in place).
  void gather(size_t begin, size_t end, void* buf, const std::string& what);
  // The sum over ranks of each rank's sum of squares (the global gradient norm's square).
  double norm_sum(double local);
  // The 1-based optimizer step the next collectives belong to (", step 12" in fault reports).
  void set_step(int64_t step) { step_ = step; }
  // Ring volume of the collectives so far.
  const CommVolume& volume() const { return volume_; }

 protected:
  virtual void run_reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& what) = 0;
  virtual void run_gather(size_t begin, size_t end, void* buf, const std::string& what) = 0;
  virtual double run_norm_sum(double local) = 0;
  // ", step 12", or nothing before the first step.
  std::string step_text() const;
  ShardLayout shards_;
  int rank_;
  int64_t step_ = 0;
  CommVolume volume_;  // the implementations add their bytes
};

// What a ZeRO optimizer step issues after the micro-batch rounds, written once for both engines'
// optimizers (ZeroOptimizer, zero.h; the device's DeviceZero): stages 0 and 1 reduce the gradient
// buckets from the top (as the last backward makes them final, where the engine says so), the
// clipping norm is the sum over ranks of each rank's sum of squares of its range, and stages 1
// and 2 gather the working weights block by block after the update. The engine gives the
// arithmetic on its memory and, on a device, the order of its streams (the hooks below).
class ZeroSteps {
 public:
  virtual ~ZeroSteps() = default;
  int stage() const { return plan_.stage(); }
  const ZeroPlan& plan() const { return plan_; }
  const ShardLayout& shards() const { return plan_.shards(); }
  // The range this rank updates and whose squares it sums: all of it for stage 0, else its shard.
  size_t own_begin() const { return own_begin_; }
  size_t own_end() const { return own_end_; }
  // Bytes this rank sent through the ZeRO collectives so far.
  CommVolume volume() const { return comm_ ? comm_->volume() : CommVolume{}; }
  // The 1-based optimizer step the next collectives belong to, named in fault reports.
  void set_step(int64_t step) {
    if (comm_) comm_->set_step(step);
  }
  // Before a step's last backward: no bucket reduced yet.
  void begin_reduction();
  // Every gradient at flat offset >= offset is final: the buckets that lie there are reduced.
  void grads_final_from(float* grads, size_t offset);
  // The remaining buckets (every bucket on a rank without micro-batches, or where the engine
  // never called grads_final_from) reduced, then reductions_done(). Stages 2 and 3 reduced their
  // blocks in the passes: only the latter. grads: the whole buffer (unused at stages 2 and 3).
  void finish_reduction(float* grads);
  // The global L2 norm of the summed gradient, before clipping; scales this rank's range so that
  // it is at most max_norm (no clipping when max_norm <= 0).
  double clip(float* grads, float max_norm);

 protected:
  ZeroSteps(ZeroPlan plan, int rank);
  // Set once by the engine's constructor: null for one rank.
  void set_comm(ZeroComm* comm) { comm_ = comm; }
  ZeroComm* comm() const { return comm_; }
  // Stages 1 and 2: every block of the working weights (params: the whole flat copy, this rank's
  // range updated) gathered, in forward order, named "<what> of <block><when>" in fault reports.
  template <class W>
  void gather_weights(W* params, const std::string& what, const std::string& when = "") {
    if (!comm_ || (stage() != 1 && stage() != 2)) return;
    before_collective();
    const std::vector<ZeroCall> calls = plan_.gather_calls();
    for (size_t b = 0; b < calls.size(); ++b) {
      comm_->gather(calls[b].begin, calls[b].end, params + calls[b].begin, what + " of " + plan_.block_name(int(b)) + when);
      gathered(int(b));
    }
  }
  // The sum of squares of this rank's range of the summed gradient; its scaling by s.
  virtual double own_sum_squares(float* grads) = 0;
  virtual void scale_own(float* grads, float s) = 0;
  // A device's stream order: the collectives follow the compute queued so far; block b's gather
  // was issued; the step's reductions were issued (wait for them here).
  virtual void before_collective() {}
  virtual void gathered(int /*b*/) {}
  virtual void reductions_done() {}

  ZeroPlan plan_;
  size_t own_begin_, own_end_;

 private:
  ZeroComm* comm_ = nullptr;
  int next_bucket_ = -1;  // the highest bucket not reduced yet
  bool reducing_ = false;  // begin_reduction() called, finish not yet
};

// The process's trace of ZeRO collectives: from start_zero_trace on, every ZeroComm call is
// appended to `path` as a line "<op> <begin> <end>" ("norm-sum 0 0"), and zero_trace_note(text)
// writes "# text" (the trainer marks each step). stop_zero_trace closes it. (The tests read it
// back: tests/zero_trace.h.)
void start_zero_trace(const std::string& path);
void stop_zero_trace();
void zero_trace_note(const std::string& text);

}  // namespace lt
