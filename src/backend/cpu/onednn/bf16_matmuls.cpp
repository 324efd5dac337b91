// The bf16 path's matrix products and their operand copies (bf16_matmuls.h).
#include "backend/cpu/onednn/bf16_matmuls.h"

#include <algorithm>
#include <iterator>

#include "backend/cpu/onednn/matmul_onednn.h"
#include "llamatrain/error.h"

namespace lt::cpu {

// Loads oneDNN now (or throws saying why) and refuses a CPU it has no bf16 products for.
Bf16Matmuls::Bf16Matmuls() {
  if (!onednn::has_bf16_matmul())
    fail(strcat("--precision bf16 on the CPU: oneDNN ", onednn::version(), " has no bf16 matrix products for this CPU's ISA, ",
                onednn::effective_isa(), " (they need AVX-512); use --precision fp32"));
}

void Bf16Matmuls::begin_forward(const float* params, size_t n, uint64_t version, int B, int Tn, const float* head_w,
                                bool bf16_logits) {
  if (params != params_ || n != n_params_ || version != version_) {
    weights_.resize(n);
    held_changed();
    convert_to_bf16(weights_.data(), params, n);
    params_ = params, n_params_ = n, version_ = version;
  }
  if (B != B_ || Tn != Tn_) copies_.clear();
  B_ = B, Tn_ = Tn;
  ce_logits_ = nullptr;
  bf16_logits_ = bf16_logits;
  head_w_ = bf16_logits ? head_w : nullptr;
  bf16_logits_at_ = nullptr;
}

void Bf16Matmuls::block_weights(const float* p, size_t n, const float* head_w) {
  forget(p, n);
  if (head_w && bf16_logits_) head_w_ = head_w;
}

void Bf16Matmuls::forget(const float* p, size_t n) {
  for (auto it = copies_.begin(); it != copies_.end();)
    it = it->first >= p && it->first < p + n ? copies_.erase(it) : std::next(it);
  // A released block's storage is reused for others: a layer's weight at the head's old address
  // must not write bf16 logits.
  if (head_w_ >= p && head_w_ < p + n) head_w_ = nullptr;
}

float* Bf16Matmuls::ce_target_logit(size_t N) {
  ce_target_logit_.resize(N);
  held_changed();
  return ce_target_logit_.data();
}

bf16* Bf16Matmuls::ce_exp(const float* logits, size_t n) {
  Copy& c = copies_[logits];
  reserve(c, n);
  c.current = false;
  ce_logits_ = logits;
  return c.data.data();
}

float* Bf16Matmuls::ce_row_max(size_t N) {
  ce_row_max_.resize(N);
  held_changed();
  return ce_row_max_.data();
}

bf16* Bf16Matmuls::produce(const float* p, size_t n) {
  Copy& c = copies_[p];
  reserve(c, n);
  c.current = true;
  return c.data.data();
}

void Bf16Matmuls::wrote(const float* p) {
  auto it = copies_.find(p);
  if (it != copies_.end()) it->second.current = false;
}

const bf16* Bf16Matmuls::operand(const float* p, size_t n) {
  if (p >= params_ && p < params_ + n_params_) {
    LT_CHECK(p + n <= params_ + n_params_, "bf16 weight operand runs past the parameters");
    return weights_.data() + (p - params_);
  }
  Copy& c = copies_[p];
  if (!c.current || c.data.size() < n) {
    reserve(c, n);
    convert_to_bf16(c.data.data(), p, n);
    c.current = true;
  }
  return c.data.data();
}

void Bf16Matmuls::reserve(Copy& c, size_t n) {
  if (c.data.size() >= n) return;
  c.data.resize(n);
  held_changed();
}

void Bf16Matmuls::held_changed() {
  size_t bytes = weights_.size() * sizeof(bf16) + (ce_row_max_.size() + ce_target_logit_.size()) * sizeof(float);
  for (const auto& [p, c] : copies_) bytes += c.data.size() * sizeof(bf16);
  peak_bytes_ = std::max(peak_bytes_, bytes);
}

void Bf16Matmuls::matmul_forward(float* out, const float* x, const float* w, int N, int IC, int OC) {
  const bf16* xb = operand(x, size_t(N) * IC);
  const bf16* wb = operand(w, size_t(OC) * IC);
  wrote(out);
  if (w == head_w_ && head_w_) {  // the logits, in bf16 only (begin_forward)
    bf16* lb = ce_exp(out, size_t(N) * OC);
    ce_logits_ = nullptr;  // they are logits, not yet the cross-entropy's exp
    bf16_logits_at_ = out;
    head_w_ = nullptr;  // once per forward: a recomputing backward's products are not the head's
    onednn::gemm_bf16_out_bf16(false, true, N, OC, IC, xb, IC, wb, IC, lb, OC);
    return;
  }
  // out (N,OC) = x (N,IC) * w^T (IC,OC)
  onednn::gemm_bf16(false, true, N, OC, IC, xb, IC, wb, IC, false, out, OC);
}

void Bf16Matmuls::matmul_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, int N,
                                  int IC, int OC) {
  const bf16* gb = operand(dout, size_t(N) * OC);
  if (dx) {
    wrote(dx);
    // dx (N,IC) = dout (N,OC) * w (OC,IC)
    onednn::gemm_bf16(false, false, N, IC, OC, gb, OC, operand(w, size_t(OC) * IC), IC, false, dx, IC);
  }
  // dw (OC,IC) += dout^T (OC,N) * x (N,IC), accumulated in fp32; none for a frozen weight (LoRA's base)
  if (dw) onednn::gemm_bf16(true, false, OC, IC, N, gb, OC, operand(x, size_t(N) * IC), IC, true, dw, IC);
}

}  // namespace lt::cpu
