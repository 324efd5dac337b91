// The CUDA backend's op policy (see pass_ops.h): dense row-major tensors mapped onto the kernels'
// params structs.
#include "backend/cuda/pass_ops.h"

#include <algorithm>
#include <cstring>

#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN

void PassOps::embedding_forward(Act* out, const int32_t* tokens, const Param* wte, int N, int C) {
  EmbeddingForwardParams p;
  p.out = out;
  p.tokens = tokens;
  p.wte = wte;
  p.N = N;
  p.C = C;
  p.out_row_stride = p.wte_row_stride = C;
  embedding_forward_cuda(p, stream);
}

void PassOps::embedding_backward(Grad* dwte, const Act* dout, const int32_t* /*tokens*/, int N, int V, int C) {
  LT_CHECK(host_tokens, "embedding backward needs the host copy of the batch's token ids");
  const EmbeddingBackwardPlan plan = embedding_backward_plan(host_tokens, N, V);
  // Sized for any plan of N tokens (at most min(N, V) distinct), so that a batch with more
  // distinct tokens than the last does not reallocate; uploaded from pinned memory on the compute
  // stream, which orders it after the kernel that read the previous plan.
  const size_t most = 2 * size_t(std::min(N, V)) + 1 + size_t(N);
  if (embedding_plan_.capacity() < most) embedding_plan_.resize(most);
  const size_t bytes = plan.data.size() * sizeof(int32_t);
  void* staged = embedding_plan_staging_.next(most * sizeof(int32_t));
  std::memcpy(staged, plan.data.data(), bytes);
  copy_to_device_async(embedding_plan_.data(), staged, bytes, stream);
  embedding_plan_staging_.copies_queued(stream);
  EmbeddingBackwardParams p;
  p.dwte = dwte;
  p.dout = dout;
  p.plan = embedding_plan_.data();
  p.n_rows = plan.n_rows;
  p.N = N;
  p.C = C;
  p.dwte_row_stride = p.dout_row_stride = C;
  embedding_backward_cuda(p, stream);
}

void PassOps::rmsnorm_forward(Act* out, Stat* rstd, const Act* x, const Param* w, int N, int C, float eps) {
  RmsnormForwardParams p;
  p.out = out;
  p.rstd = rstd;
  p.x = x;
  p.weight = w;
  p.N = N;
  p.C = C;
  p.x_row_stride = p.out_row_stride = C;
  p.eps = eps;
  rmsnorm_forward_cuda(p, stream);
}

void PassOps::rmsnorm_backward(Act* dx, Grad* dw, const Act* dout, const Act* x, const Param* w, const Stat* rstd,
                               int N, int C) {
  const size_t scratch = rmsnorm_backward_scratch_floats(N, C);
  if (rmsnorm_scratch_.size() < scratch) rmsnorm_scratch_.resize(scratch);
  RmsnormBackwardParams p;
  p.dx = dx;
  p.dweight = dw;
  p.scratch = rmsnorm_scratch_.data();
  p.dout = dout;
  p.x = x;
  p.weight = w;
  p.rstd = rstd;
  p.N = N;
  p.C = C;
  p.dx_row_stride = p.dout_row_stride = p.x_row_stride = C;
  rmsnorm_backward_cuda(p, stream);
}

void PassOps::matmul_forward(Act* out, const Act* x, const Param* w, int N, int IC, int OC) {
  cuda::matmul_forward(out, x, w, N, IC, OC, stream);
}

void PassOps::matmul_backward(Act* dx, Grad* dw, const Act* dout, const Act* x, const Param* w, int N, int IC,
                              int OC) {
  cuda::matmul_backward(dx, dw, dout, x, w, N, IC, OC, stream);
}

namespace {
RopeParams rope_params(__nv_bfloat16* out, const __nv_bfloat16* x, const int32_t* pos, int B, int Tn, int H, int hd, float theta) {
  RopeParams p;
  p.q.out = out;
  p.q.x = x;
  p.q.H = H;
  p.q.x_token_stride = p.q.out_token_stride = int64_t(H) * hd;
  p.q.x_head_stride = p.q.out_head_stride = hd;
  p.pos = pos;
  p.B = B;
  p.T = Tn;
  p.hd = hd;
  p.theta = theta;
  return p;
}

template <class T>
AttentionHeads<T> heads(T* ptr, int n_heads, int hd) {
  AttentionHeads<T> h;
  h.ptr = ptr;
  h.token_stride = int64_t(n_heads) * hd;
  h.head_stride = hd;
  return h;
}
}  // namespace

void PassOps::rope_forward(Act* out, const Act* x, const int32_t* pos, int B, int Tn, int H, int hd, float theta) {
  rope_forward_cuda(rope_params(out, x, pos, B, Tn, H, hd, theta), stream);
}

void PassOps::rope_backward(Act* dx, const Act* dout, const int32_t* pos, int B, int Tn, int H, int hd, float theta) {
  rope_backward_cuda(rope_params(dx, dout, pos, B, Tn, H, hd, theta), stream);
}

void PassOps::attention_forward(Act* out, Stat* lse, const Act* q, const Act* k, const Act* v,
                                const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd) {
  AttentionParams p;
  p.out = heads(out, H, hd);
  p.lse = lse;
  p.q = heads(q, H, hd);
  p.k = heads(k, KVH, hd);
  p.v = heads(v, KVH, hd);
  p.seg_start = seg_start;
  p.B = B;
  p.T = Tn;
  p.H = H;
  p.KVH = KVH;
  p.hd = hd;
  if (attention == Attention::kCudnn) {
    p.seg_start = nullptr;  // the batch has one example per row (checked by CudaModel::forward)
    return cudnn_attention_forward(p, stream);
  }
  attention_forward_cuda(p, stream);
}

void PassOps::attention_backward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* out, const Stat* lse,
                                 const Act* q, const Act* k, const Act* v, const int32_t* seg_start, int B, int Tn,
                                 int H, int KVH, int hd) {
  const size_t dsum = size_t(B) * H * Tn;
  if (attention_dsum_.size() < dsum) attention_dsum_.resize(dsum);
  AttentionParams p;
  p.out = heads(const_cast<Act*>(out), H, hd);  // read only in the backward pass
  p.lse = const_cast<Stat*>(lse);               // read only in the backward pass
  p.q = heads(q, H, hd);
  p.k = heads(k, KVH, hd);
  p.v = heads(v, KVH, hd);
  p.seg_start = seg_start;
  p.dout = heads(dout, H, hd);
  p.dq = heads(dq, H, hd);
  p.dk = heads(dk, KVH, hd);
  p.dv = heads(dv, KVH, hd);
  p.dsum = attention_dsum_.data();
  p.B = B;
  p.T = Tn;
  p.H = H;
  p.KVH = KVH;
  p.hd = hd;
  if (attention == Attention::kCudnn) {
    p.seg_start = nullptr;  // as in attention_forward
    return cudnn_attention_backward(p, stream);
  }
  attention_backward_cuda(p, stream);
}

void PassOps::swiglu_forward(Act* out, const Act* h1, const Act* h3, int N, int F) {
  SwigluForwardParams p;
  p.out = out;
  p.h1 = h1;
  p.h3 = h3;
  p.N = N;
  p.F = F;
  p.out_row_stride = p.h1_row_stride = p.h3_row_stride = F;
  swiglu_forward_cuda(p, stream);
}

void PassOps::swiglu_backward(Act* dh1, Act* dh3, const Act* dout, const Act* h1, const Act* h3, int N, int F) {
  SwigluBackwardParams p;
  p.dh1 = dh1;
  p.dh3 = dh3;
  p.dout = dout;
  p.h1 = h1;
  p.h3 = h3;
  p.N = N;
  p.F = F;
  p.dh1_row_stride = p.dh3_row_stride = p.dout_row_stride = p.h1_row_stride = p.h3_row_stride = F;
  swiglu_backward_cuda(p, stream);
}

void PassOps::residual_add(Act* out, const Act* a, const Act* b, size_t n) { residual_add_cuda(out, a, b, n, stream); }

void PassOps::scale(Act* x, float s, size_t n) { scale_inplace_cuda(x, s, n, stream); }

void PassOps::dropout(Act* out, const Act* x, size_t n, float p, uint64_t mask_stream) {
  dropout_cuda(out, x, n, p, mask_stream, stream);
}

double PassOps::crossentropy_forward(Stat* losses, Stat* lse, const Act* logits, const int32_t* targets,
                                     const uint8_t* mask, int N, int V) {
  loss_sum_.resize(1);
  CrossentropyForwardParams p;
  p.losses = losses;
  p.lse = lse;
  p.loss_sum = loss_out ? loss_out : loss_sum_.data();
  p.logits = logits;
  p.targets = targets;
  p.mask = mask;
  p.N = N;
  p.V = V;
  p.logits_row_stride = V;
  crossentropy_forward_cuda(p, stream);
  if (loss_out) return 0.0;
  double sum = 0.0;
  copy_to_host(&sum, loss_sum_.data(), sizeof sum);
  return sum;
}

void PassOps::crossentropy_backward(Act* dlogits, const Act* logits, const Stat* lse, const int32_t* targets,
                                    const uint8_t* mask, float dloss, int N, int V) {
  CrossentropyBackwardParams p;
  p.dlogits = dlogits;
  p.logits = logits;
  p.lse = lse;
  p.targets = targets;
  p.mask = mask;
  p.dloss = dloss;
  p.N = N;
  p.V = V;
  p.dlogits_row_stride = p.logits_row_stride = V;
  crossentropy_backward_cuda(p, stream);
}

LT_CUDA_NAMESPACE_END
