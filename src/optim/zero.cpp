#include "llamatrain/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt {

ShardLayout::ShardLayout(size_t n_params, int world_size) : n(n_params), world(world_size) {
  LT_CHECK(world_size >= 1, "world size ", world_size);
  shard = (n + size_t(world) - 1) / size_t(world);
  padded = shard * size_t(world);
}

size_t ShardLayout::begin(int r) const { return std::min(n, size_t(r) * shard); }
size_t ShardLayout::end(int r) const { return std::min(n, size_t(r + 1) * shard); }

std::vector<MemoryRow> memory_table(size_t n_params, int world, int zero_stage, double activation_bytes) {
  const ShardLayout s(n_params, world);
  std::vector<MemoryRow> rows;
  for (int r = 0; r < world; ++r) {
    MemoryRow m;
    m.rank = r;
    m.params = 4.0 * double(s.padded);  // the working copy every rank computes with
    m.grads = 4.0 * double(s.padded);   // accumulated over the rank's micro-batches, reduced in place
    const double owned = zero_stage == 0 ? double(n_params) : double(s.end(r) - s.begin(r));
    m.optimizer = 8.0 * owned;          // Adam m and v, fp32
    m.activations = activation_bytes;
    rows.push_back(m);
  }
  return rows;
}

std::string format_memory_table(const std::vector<MemoryRow>& rows, int zero_stage) {
  auto mib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%10.2f", b / (1024.0 * 1024.0));
    return std::string(buf);
  };
  std::string out = strcat("memory per rank (MiB), ZeRO stage ", zero_stage, ":\n",
                           "  rank      params       grads   optimizer activations       total\n");
  for (const MemoryRow& m : rows) {
    char head[16];
    std::snprintf(head, sizeof head, "  %4d  ", m.rank);
    out += head + mib(m.params) + "  " + mib(m.grads) + "  " + mib(m.optimizer) + "  " + mib(m.activations) + "  " +
           mib(m.total()) + "\n";
  }
  out += "  (fp32 working parameters and gradients; optimizer = Adam m, v of the parameters the rank updates;\n"
         "   activations estimated for one micro-batch)\n";
  return out;
}

ZeroOptimizer::ZeroOptimizer(Comm& comm, const ParameterLayout& layout, int stage, AdamWConfig cfg)
    : comm_(comm),
      stage_(stage),
      shards_(layout.total(), comm.size()),
      own_begin_(stage == 0 ? 0 : shards_.begin(comm.rank())),
      own_end_(stage == 0 ? layout.total() : shards_.end(comm.rank())),
      adamw_(layout, own_begin_, own_end_, cfg) {
  if (stage < 0 || stage > 2) fail(strcat("--zero ", stage, ": expected 0, 1 or 2"));
}

void ZeroOptimizer::reduce_gradients(float* grads) {
  if (comm_.size() == 1) return;
  if (stage_ == 2) comm_.reduce_scatter_sum(grads, shards_.shard, DType::kF32);
  else comm_.allreduce_sum(grads, shards_.padded, DType::kF32);
}

double ZeroOptimizer::clip_gradients(float* grads, float max_norm) {
  double sq;
  if (stage_ == 0) {
    sq = cpu::sum_squares(grads, shards_.n);
  } else {
    const size_t b = shards_.begin(comm_.rank()), e = shards_.end(comm_.rank());
    sq = comm_.allreduce_sum(cpu::sum_squares(grads + b, e - b));
  }
  const double norm = std::sqrt(sq);
  if (max_norm > 0.f && norm > max_norm)
    cpu::scale_inplace(grads + own_begin_, float(max_norm / (norm + 1e-6)), own_end_ - own_begin_);
  return norm;
}

void ZeroOptimizer::step(float* params, const float* grads, float lr, int64_t t) {
  adamw_.step(params, grads, lr, t);
  if (stage_ > 0 && comm_.size() > 1) comm_.allgather(params, shards_.shard, DType::kF32);
}

size_t ZeroOptimizer::optimizer_bytes() const { return 2 * sizeof(float) * (own_end_ - own_begin_); }

}  // namespace lt
