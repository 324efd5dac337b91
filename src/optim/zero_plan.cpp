#include "llamatrain/zero_plan.h"

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include "llamatrain/error.h"
#include "llamatrain/zero_blocks.h"

namespace lt {

ShardLayout::ShardLayout(size_t n_params, int world_size) : n(n_params), world(world_size) {
  LT_CHECK(world_size >= 1, "world size ", world_size);
  shard = (n + size_t(world) - 1) / size_t(world);
  padded = shard * size_t(world);
}

size_t ShardLayout::begin(int r) const { return std::min(n, size_t(r) * shard); }
size_t ShardLayout::end(int r) const { return std::min(n, size_t(r + 1) * shard); }

std::vector<size_t> ShardLayout::pieces(size_t b, size_t e) const {
  std::vector<size_t> out(size_t(world), 0);
  for (int r = 0; r < world; ++r) {
    const size_t lo = std::max(b, begin(r)), hi = std::min(e, end(r));
    if (lo < hi) out[size_t(r)] = hi - lo;
  }
  return out;
}

GradientBuckets gradient_buckets(const ParameterLayout& layout, size_t padded, size_t bucket_bytes) {
  const auto& blocks = layout.blocks;
  LT_CHECK(!blocks.empty() && blocks.front().begin == 0 && blocks.back().end <= padded,
           "gradient_buckets: the blocks do not tile [0, ", padded, ")");
  // From the top down: bucket k's blocks are [first, last]; it closes once it holds bucket_bytes.
  GradientBuckets g;
  std::vector<size_t> tops{padded};
  size_t top = padded;
  for (int b = int(blocks.size()) - 1; b >= 0; --b) {
    const size_t begin = blocks[size_t(b)].begin;
    if (b == 0 || (top - begin) * sizeof(float) >= bucket_bytes) {
      g.first_block.push_back(b);
      tops.push_back(begin);
      top = begin;
    }
  }
  g.bounds.assign(tops.rbegin(), tops.rend());
  std::reverse(g.first_block.begin(), g.first_block.end());
  return g;
}

const char* zero_op_name(ZeroOp op) {
  switch (op) {
    case ZeroOp::kAllReduce: return "all-reduce";
    case ZeroOp::kReduceScatter: return "reduce-scatter";
    case ZeroOp::kAllGather: return "all-gather";
    case ZeroOp::kNormSum: return "norm-sum";
  }
  return "?";
}

std::string ZeroCall::text() const {
  if (op == ZeroOp::kNormSum) return zero_op_name(op);
  return strcat(zero_op_name(op), " [", begin, ", ", end, ")");
}

ZeroPlan::ZeroPlan(const ParameterLayout& layout, int world, int stage, const ZeroPlanOptions& options)
    : stage_(stage), shards_(layout.total(), world), options_(options), layout_(&layout), blocks_(layout.blocks) {
  if (stage < 0 || stage > 3) fail(strcat("--zero ", stage, ": expected 0, 1, 2 or 3"));
  LT_CHECK(!options.frozen || stage == 3, "a frozen base is planned at ZeRO stage 3 only, not ", stage);
  buckets_ = gradient_buckets(layout, shards_.padded, options.bucket_bytes);
}

ZeroPlan::ZeroPlan(size_t total, int world, int stage, const ZeroPlanOptions& options)
    : stage_(stage), shards_(total, world), options_(options), layout_(nullptr) {
  LT_CHECK(stage == 0 || stage == 1, "a flat table of tensors takes ZeRO stage 0 or 1, not ", stage);
  blocks_.push_back({0, total});
  buckets_.bounds = {0, shards_.padded};
  buckets_.first_block = {0};
}

namespace {
// The block calls of the pass (llama2_pass.h, as idle_forward_blocks and idle_backward_blocks
// repeat them) turned into the collectives a ZeRO engine issues for them.
class PlanWalker final : public ParamBlocks<float, float> {
 public:
  PlanWalker(const ZeroPlan& plan, std::vector<ZeroCall>& out)
      : plan_(plan),
        out_(out),
        gathers_(plan.stage() == 3 && plan.world() > 1),
        reduces_(plan.stage() >= 2 && plan.world() > 1 && !plan.options().frozen) {}
  const float* acquire(int b) override {
    if (!gathers_) return nullptr;
    auto it = held_.find(b);
    if (it == held_.end()) it = gather(b);
    ++it->second;
    return nullptr;
  }
  void prefetch(int b) override {
    if (gathers_ && plan_.options().prefetch && !held_.count(b)) gather(b);
  }
  void release(int b) override {
    if (!gathers_) return;
    auto it = held_.find(b);
    LT_CHECK(it != held_.end() && it->second > 0, "ZeroPlan: block ", b, " released but not acquired");
    if (--it->second == 0) held_.erase(it);
  }
  float* grads(int) override { return nullptr; }
  void grads_done(int b) override {
    if (reduces_) out_.push_back({ZeroOp::kReduceScatter, plan_.blocks()[size_t(b)].begin, plan_.blocks()[size_t(b)].end});
  }

 private:
  std::map<int, int>::iterator gather(int b) {
    out_.push_back({ZeroOp::kAllGather, plan_.blocks()[size_t(b)].begin, plan_.blocks()[size_t(b)].end});
    return held_.emplace(b, 0).first;
  }
  const ZeroPlan& plan_;
  std::vector<ZeroCall>& out_;
  bool gathers_, reduces_;
  std::map<int, int> held_;  // block -> users (0: prefetched, not yet acquired)
};
}  // namespace

std::vector<ZeroCall> ZeroPlan::walk_blocks(bool backward) const {
  std::vector<ZeroCall> out;
  if (!layout_ || stage_ < 2 || world() == 1) return out;
  PlanWalker w(*this, out);
  idle_forward_blocks(w, *layout_);
  if (backward) idle_backward_blocks(w, *layout_);
  return out;
}

std::vector<ZeroCall> ZeroPlan::round_calls() const { return walk_blocks(true); }
std::vector<ZeroCall> ZeroPlan::forward_calls() const { return walk_blocks(false); }

std::vector<ZeroCall> ZeroPlan::gather_calls() const {
  std::vector<ZeroCall> out;
  if (world() == 1) return out;
  for (const auto& blk : blocks_) out.push_back({ZeroOp::kAllGather, blk.begin, blk.end});
  return out;
}

std::vector<ZeroCall> ZeroPlan::update_calls() const {
  std::vector<ZeroCall> out;
  if (world() == 1 || options_.frozen) return out;
  if (stage_ <= 1) {
    const ZeroOp op = stage_ == 0 ? ZeroOp::kAllReduce : ZeroOp::kReduceScatter;
    for (size_t k = buckets_.size(); k-- > 0;) out.push_back({op, buckets_.bounds[k], buckets_.bounds[k + 1]});
  }
  if (stage_ == 0) return out;
  out.push_back({ZeroOp::kNormSum, 0, 0});
  if (stage_ == 1 || stage_ == 2) {
    const std::vector<ZeroCall> g = gather_calls();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

std::vector<ZeroCall> ZeroPlan::step_calls(int rounds) const {
  std::vector<ZeroCall> out;
  const std::vector<ZeroCall> round = round_calls();
  for (int k = 0; k < rounds; ++k) out.insert(out.end(), round.begin(), round.end());
  const std::vector<ZeroCall> update = update_calls();
  out.insert(out.end(), update.begin(), update.end());
  return out;
}

// ---- the trace ----

namespace {
struct ZeroTrace {
  std::mutex mu;
  std::unique_ptr<std::ofstream> out;
};
ZeroTrace& zero_trace() {
  static ZeroTrace t;
  return t;
}
void trace_line(const std::string& line) {
  ZeroTrace& t = zero_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.out) *t.out << line << '\n' << std::flush;
}
}  // namespace

void start_zero_trace(const std::string& path) {
  ZeroTrace& t = zero_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  t.out = std::make_unique<std::ofstream>(path, std::ios::trunc);
  if (!*t.out) fail(strcat("--trace-collectives: cannot write ", path));
}

void stop_zero_trace() {
  ZeroTrace& t = zero_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  t.out.reset();
}

void zero_trace_note(const std::string& text) { trace_line("# " + text); }

// ---- ZeroComm ----

void ZeroComm::reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& what) {
  LT_CHECK(op == ZeroOp::kAllReduce || op == ZeroOp::kReduceScatter, "ZeroComm::reduce: ", zero_op_name(op));
  trace_line(strcat(zero_op_name(op), " ", begin, " ", end));
  run_reduce(op, begin, end, buf, what);
}

void ZeroComm::gather(size_t begin, size_t end, void* buf, const std::string& what) {
  trace_line(strcat(zero_op_name(ZeroOp::kAllGather), " ", begin, " ", end));
  run_gather(begin, end, buf, what);
}

double ZeroComm::norm_sum(double local) {
  trace_line(strcat(zero_op_name(ZeroOp::kNormSum), " 0 0"));
  return run_norm_sum(local);
}

std::string ZeroComm::step_text() const { return step_ > 0 ? strcat(", step ", step_) : std::string(); }

std::string ZeroPlan::block_name(int b) const {
  return layout_ ? parameter_block_name(*layout_, b) : std::string("the table");
}

std::string ZeroPlan::bucket_name(size_t k) const {
  if (!layout_) return "the table";
  const int head = layout_->head_block();
  const int first = buckets_.first_block[k];
  const int last = k + 1 < buckets_.size() ? buckets_.first_block[k + 1] - 1 : head;
  if (first == last) return block_name(first);
  std::vector<std::string> parts;
  if (first == 0) parts.push_back(block_name(0));
  const int l0 = std::max(first, 1) - 1, l1 = std::min(last, head - 1) - 1;
  if (l0 == l1) parts.push_back(strcat("layer ", l0));
  if (l0 < l1) parts.push_back(strcat("layers ", l0, "-", l1));
  if (last == head) parts.push_back(block_name(last));
  std::string name = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) name += (i + 1 < parts.size() ? ", " : " and ") + parts[i];
  return name;
}

ZeroSteps::ZeroSteps(ZeroPlan plan, int rank)
    : plan_(std::move(plan)),
      own_begin_(plan_.stage() == 0 ? 0 : plan_.shards().begin(rank)),
      own_end_(plan_.stage() == 0 ? plan_.shards().n : plan_.shards().end(rank)) {}

void ZeroSteps::begin_reduction() {
  next_bucket_ = int(plan_.buckets().size()) - 1;
  reducing_ = true;
}

void ZeroSteps::grads_final_from(float* grads, size_t offset) {
  if (!comm_ || plan_.stage() >= 2) return;
  const GradientBuckets& k = plan_.buckets();
  const ZeroOp op = plan_.stage() == 0 ? ZeroOp::kAllReduce : ZeroOp::kReduceScatter;
  for (; next_bucket_ >= 0 && k.bounds[size_t(next_bucket_)] >= offset; --next_bucket_) {
    const size_t i = size_t(next_bucket_), b = k.bounds[i], e = k.bounds[i + 1];
    before_collective();
    comm_->reduce(op, b, e, grads + b, "gradients of " + plan_.bucket_name(i));
  }
}

void ZeroSteps::finish_reduction(float* grads) {
  if (!comm_) return;
  if (plan_.stage() < 2) {
    if (!reducing_) begin_reduction();
    grads_final_from(grads, 0);
    reducing_ = false;
  }
  reductions_done();
}

double ZeroSteps::clip(float* grads, float max_norm) {
  double sq = own_sum_squares(grads);
  if (plan_.stage() > 0 && comm_) sq = comm_->norm_sum(sq);
  const double norm = std::sqrt(sq);
  if (max_norm > 0.f && norm > max_norm) scale_own(grads, float(max_norm / (norm + 1e-6)));
  return norm;
}

}  // namespace lt
