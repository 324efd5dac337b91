// The CPU backend's op set: the reference every other backend is tested against.
//
// Row-major contiguous tensors; N = B*T token rows; shapes are given next to each pointer.
// Templates over the scalar type T: float is the backend, double is used by the
// finite-difference tests (explicitly instantiated for both in src/backend/cpu/).
// Backward ops `+=` into parameter gradients (dw, dwte) and `=` into activation gradients
// (dx, dq, dk, dv, dh1, dh3, dlogits). Every op is parallelised with OpenMP.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lt::cpu {

// out[i,:] = wte[tokens[i],:]
template <class T>
void embedding_forward(T* out /*(N,C)*/, const int32_t* tokens /*(N)*/, const T* wte /*(V,C)*/,
                       int N, int C);
// dwte[tokens[i],:] += dout[i,:]; deterministic (rows summed in index order for every id).
template <class T>
void embedding_backward(T* dwte /*(V,C) +=*/, const T* dout /*(N,C)*/, const int32_t* tokens,
                        int N, int V, int C);

// out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps)
template <class T>
void rmsnorm_forward(T* out /*(N,C)*/, T* rstd /*(N)*/, const T* x /*(N,C)*/, const T* w /*(C)*/,
                     int N, int C, float eps);
template <class T>
void rmsnorm_backward(T* dx /*(N,C) =*/, T* dw /*(C) +=*/, const T* dout /*(N,C)*/,
                      const T* x /*(N,C)*/, const T* w /*(C)*/, const T* rstd /*(N)*/, int N, int C);

// out = x @ w^T (PyTorch Linear without bias), through BLAS.
template <class T>
void matmul_forward(T* out /*(N,OC)*/, const T* x /*(N,IC)*/, const T* w /*(OC,IC)*/, int N, int IC,
                    int OC);
// dx = dout @ w (skipped when dx is null); dw += dout^T @ x.
template <class T>
void matmul_backward(T* dx /*(N,IC) =*/, T* dw /*(OC,IC) +=*/, const T* dout /*(N,OC)*/,
                     const T* x /*(N,IC)*/, const T* w /*(OC,IC)*/, int N, int IC, int OC);

// RoPE, Meta layout: pairs (2i, 2i+1) of each head rotated by angle p * theta^(-2i/hd), where p is
// pos[b,t] (positions restart at example boundaries) or t when pos is null. out may alias x.
template <class T>
void rope_forward(T* out /*(B,T,H,hd)*/, const T* x /*(B,T,H,hd)*/, const int32_t* pos /*(B,T)*/,
                  int B, int Tn, int H, int hd, float theta);
// The transposed rotation. dx may alias dout.
template <class T>
void rope_backward(T* dx /*(B,T,H,hd) =*/, const T* dout /*(B,T,H,hd)*/, const int32_t* pos,
                   int B, int Tn, int H, int hd, float theta);

// Causal attention with GQA and example boundaries: query t of head h attends to keys s with
// seg_start[b,t] <= s <= t (seg_start null: 0 <= s <= t) of KV head h / (H / KVH), with
// softmax(q.k / sqrt(hd)). lse is the log-sum-exp of the scaled scores per query, kept for backward.
template <class T>
void attention_forward(T* out /*(B,T,H,hd)*/, T* lse /*(B,H,T)*/, const T* q /*(B,T,H,hd)*/,
                       const T* k /*(B,T,KVH,hd)*/, const T* v /*(B,T,KVH,hd)*/,
                       const int32_t* seg_start /*(B,T)*/, int B, int Tn, int H, int KVH, int hd);
template <class T>
void attention_backward(T* dq /*(B,T,H,hd) =*/, T* dk /*(B,T,KVH,hd) =*/, T* dv /*(B,T,KVH,hd) =*/,
                        const T* dout /*(B,T,H,hd)*/, const T* out /*(B,T,H,hd)*/,
                        const T* lse /*(B,H,T)*/, const T* q, const T* k, const T* v,
                        const int32_t* seg_start, int B, int Tn, int H, int KVH, int hd);

// Decoding with a KV cache: one query per head against the n cached positions 0..n-1, with
// softmax(q.k / sqrt(hd)) over them and GQA as above; position s's KV heads start at k + s * kv_stride
// (and v + s * kv_stride).
template <class T>
void attention_decode(T* out /*(H,hd) =*/, const T* q /*(H,hd)*/, const T* k, const T* v, int64_t kv_stride, int n,
                      int H, int KVH, int hd);

// out = silu(h1) * h3, silu(x) = x / (1 + exp(-x))
template <class T>
void swiglu_forward(T* out /*(N,F)*/, const T* h1 /*(N,F)*/, const T* h3 /*(N,F)*/, int N, int F);
template <class T>
void swiglu_backward(T* dh1 /*(N,F) =*/, T* dh3 /*(N,F) =*/, const T* dout /*(N,F)*/,
                     const T* h1, const T* h3, int N, int F);

// out = a + b (out may alias a or b).
template <class T>
void residual_add(T* out, const T* a, const T* b, size_t n);
// x *= s.
template <class T>
void scale(T* x, float s, size_t n);
// Inverted dropout: out[i] = x[i] / (1 - p) where element i is kept, else 0; element i is dropped
// when the uniform draw of mix64(stream, i) is below p, so the same stream gives the same mask (out
// may alias x).
template <class T>
void dropout(T* out, const T* x, size_t n, float p, uint64_t stream);

// Fused softmax + cross-entropy with a loss mask, each row's weight (0: not counted; the datasets'
// loss_mask, prepare --decision-weight). losses[i] = mask[i] * (lse_i - logits[i,t_i]),
// lse[i] = log sum_j exp(logits[i,j]). Returns sum_i losses[i] (accumulated in double).
template <class T>
double crossentropy_forward(T* losses /*(N)*/, T* lse /*(N)*/, const T* logits /*(N,V)*/,
                            const int32_t* targets /*(N)*/, const uint8_t* mask /*(N)*/, int N, int V);
// dlogits[i,:] = mask[i] * dloss * (softmax(logits[i,:]) - onehot(t_i)); dlogits may alias logits.
// dloss is d(total objective)/d(loss of one token), e.g. 1 / (global count of loss tokens).
template <class T>
void crossentropy_backward(T* dlogits /*(N,V) =*/, const T* logits /*(N,V)*/, const T* lse /*(N)*/,
                           const int32_t* targets, const uint8_t* mask, float dloss, int N, int V);

// ---- optimizer-side ops on fp32 shards ----
// AdamW (decoupled weight decay) on n elements at 1-based step t:
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
void adamw_update(float* param, float* m, float* v, const float* grad, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);
// sum of squares in double.
double sum_squares(const float* x, size_t n);
// x *= s
void scale_inplace(float* x, float s, size_t n);
// bf16 (the high 16 bits of an fp32) to fp32, and fp32 to bf16 rounded to nearest even (NaN kept
// quiet; src/backend/cpu/onednn/bf16.h), in parallel: the host half of a device's offloaded step.
void widen_bf16(float* out, const uint16_t* x, size_t n);
void round_to_bf16(uint16_t* out, const float* x, size_t n);

}  // namespace lt::cpu
