#include "llamatrain/zero_blocks.h"

#include <algorithm>

#include "llamatrain/error.h"
#include "llamatrain/safetensors.h"
#include "llamatrain/zero.h"

namespace lt {

using safetensors::bf16_to_f32;
using safetensors::f32_to_bf16;

HostZeroComm::HostZeroComm(Comm& comm, const ShardLayout& shards, DType wire)
    : ZeroComm(shards, comm.rank()), comm_(comm), wire_(wire) {
  LT_CHECK(wire == DType::kF32 || wire == DType::kBF16, "gradient reduction dtype ", dtype_name(wire));
}

void HostZeroComm::run_reduce(ZeroOp op, size_t begin, size_t end, float* buf, const std::string& /*what*/) {
  const bool scatter = op == ZeroOp::kReduceScatter;
  const bool bf16 = wire_ == DType::kBF16;
  const std::vector<size_t> pieces = scatter ? shards_.pieces(begin, end) : std::vector<size_t>{end - begin};
  for_windows(pieces, kCommWindow, [&](size_t at, const std::vector<size_t>& n) {
    size_t m = 0;
    for (size_t c : n) m += c;
    float* w = buf + at;
    if (!bf16) {
      if (scatter) comm_.reduce_scatter_v_sum(w, n, DType::kF32);
      else comm_.allreduce_sum(w, m, DType::kF32);
      return;
    }
    scratch_.resize(m);
    for (size_t i = 0; i < m; ++i) scratch_[i] = f32_to_bf16(w[i]);
    if (scatter) comm_.reduce_scatter_v_sum(scratch_.data(), n, DType::kBF16);
    else comm_.allreduce_sum(scratch_.data(), m, DType::kBF16);
    for (size_t i = 0; i < m; ++i) w[i] = bf16_to_f32(scratch_[i]);
  });
  const double bytes = double(dtype_size(wire_)) * double(end - begin);
  if (scatter) volume_.reduce_scatter += ring_bytes(bytes, shards_.world);
  else volume_.allreduce += 2 * ring_bytes(bytes, shards_.world);
}

void HostZeroComm::run_gather(size_t begin, size_t end, void* buf, const std::string& /*what*/) {
  auto* p = static_cast<float*>(buf);
  for_windows(shards_.pieces(begin, end), kCommWindow,
              [&](size_t at, const std::vector<size_t>& n) { comm_.allgather_v(p + at, n, DType::kF32); });
  volume_.allgather += ring_bytes(4.0 * double(end - begin), shards_.world);
}

std::string parameter_block_name(const ParameterLayout& layout, int b) {
  if (b == 0) return "the embedding";
  if (b == layout.head_block()) return "the final norm and output head";
  return strcat("layer ", b - 1);
}

size_t ZeroBlocks::held_bytes() const {
  size_t n = 0;
  for (const auto* held : {&weights_held_, &grads_held_})
    for (const auto& [b, v] : *held) n += v.size() * sizeof(float);
  return n;
}

}  // namespace lt
