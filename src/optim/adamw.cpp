#include <algorithm>
#include <cmath>

#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/optim.h"

namespace lt {

AdamW::AdamW(const std::vector<TensorInfo>& tensors, size_t total, size_t begin, size_t end, AdamWConfig cfg)
    : begin_(begin), end_(end), cfg_(cfg) {
  LT_CHECK(begin <= end && end <= total, "bad AdamW range [", begin, ", ", end, ")");
  for (const auto& t : tensors) {
    const size_t b = std::max(begin, t.offset), e = std::min(end, t.offset + t.numel);
    if (b < e) ranges_.push_back({b, e, t.weight_decay});
  }
  m_.assign(end - begin, 0.f);
  v_.assign(end - begin, 0.f);
}

void AdamW::step_window(float* params, const float* grads, size_t lo, size_t hi, float lr, int64_t t) {
  LT_CHECK(begin_ <= lo && lo <= hi && hi <= end_, "AdamW window [", lo, ", ", hi, ") outside [", begin_, ", ", end_, ")");
  moments_zero_ = false;
  for (const auto& r : ranges_) {
    const size_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
    if (b >= e) continue;
    cpu::adamw_update(params + (b - lo), m_.data() + (b - begin_), v_.data() + (b - begin_), grads + (b - lo), e - b,
                      lr, cfg_.beta1, cfg_.beta2, cfg_.eps, r.decay ? cfg_.weight_decay : 0.f, int(t));
  }
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return max_lr * float(step + 1) / float(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, double(step - warmup_steps) / double(decay_steps));
  return float(min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (max_lr - min_lr));
}

double clip_grad_norm(float* grads, size_t n, float max_norm) {
  const double norm = std::sqrt(cpu::sum_squares(grads, n));
  if (max_norm > 0.f && norm > max_norm) cpu::scale_inplace(grads, float(max_norm / (norm + 1e-6)), n);
  return norm;
}

}  // namespace lt
