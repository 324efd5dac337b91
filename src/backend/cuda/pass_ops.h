// The CUDA backend's op policy for the shared forward/backward pass (src/model/llama2_pass.h):
// bf16 activations and working weights, fp32 parameter gradients and row statistics, device
// buffers, and the kernels of kernels/ plus the matrix products of device.h. Each op fills the
// kernel's params struct with dense strides. Compiled in both builds (see device.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "attention.cuh"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/device.h"
#include "backend/cuda/upload_staging.h"
#include "crossentropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "optimizer.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"
#include "llamatrain/config.h"

LT_CUDA_NAMESPACE_BEGIN

struct PassOps {
  using Act = __nv_bfloat16;
  using Param = __nv_bfloat16;
  using Grad = float;
  using Stat = float;
  template <class U>
  using Buffer = DeviceBuffer<U>;

  cudaStream_t stream = nullptr;
  // The host copy of the batch's input ids (B*T), for the embedding backward's host-built plan;
  // set by the caller before backward().
  const int32_t* host_tokens = nullptr;
  // Where crossentropy_forward leaves the summed loss (one double of device memory), to be read
  // later with the step's other losses; null: copied to the host at once (a synchronisation point).
  double* loss_out = nullptr;
  Attention attention = Attention::kNative;
  // LoRA adapters (llama2_pass.h): the pass's scale and dropout ops below, and matmul_backward
  // without a weight gradient for the frozen base.
  static constexpr bool kLora = true;
  // Called when every parameter gradient at flat offset >= offset is final for this backward
  // (the ZeRO reduction starts on those buckets); set only for a step's last micro-batch.
  std::function<void(size_t)> on_grads_final;
  void grads_final_from(size_t offset) {
    if (on_grads_final) on_grads_final(offset);
  }
  // Called before the pass reads parameter block b's weights from the flat buffer (the ZeRO 1/2
  // optimizer makes the stream wait for the block's all-gather; device_zero.h).
  std::function<void(int)> on_weights_needed;
  void weights_needed(int b) {
    if (on_weights_needed) on_weights_needed(b);
  }

  void embedding_forward(Act* out, const int32_t* tokens, const Param* wte, int N, int C);
  void embedding_backward(Grad* dwte, const Act* dout, const int32_t* tokens, int N, int V, int C);
  void rmsnorm_forward(Act* out, Stat* rstd, const Act* x, const Param* w, int N, int C, float eps);
  void rmsnorm_backward(Act* dx, Grad* dw, const Act* dout, const Act* x, const Param* w, const Stat* rstd, int N,
                        int C);
  void matmul_forward(Act* out, const Act* x, const Param* w, int N, int IC, int OC);
  void matmul_backward(Act* dx, Grad* dw, const Act* dout, const Act* x, const Param* w, int N, int IC, int OC);
  void rope_forward(Act* out, const Act* x, const int32_t* pos, int B, int Tn, int H, int hd, float theta);
  void rope_backward(Act* dx, const Act* dout, const int32_t* pos, int B, int Tn, int H, int hd, float theta);
  void attention_forward(Act* out, Stat* lse, const Act* q, const Act* k, const Act* v, const int32_t* seg_start,
                         int B, int Tn, int H, int KVH, int hd);
  void attention_backward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* out, const Stat* lse, const Act* q,
                          const Act* k, const Act* v, const int32_t* seg_start, int B, int Tn, int H, int KVH,
                          int hd);
  void swiglu_forward(Act* out, const Act* h1, const Act* h3, int N, int F);
  void swiglu_backward(Act* dh1, Act* dh3, const Act* dout, const Act* h1, const Act* h3, int N, int F);
  void residual_add(Act* out, const Act* a, const Act* b, size_t n);
  void scale(Act* x, float s, size_t n);
  void dropout(Act* out, const Act* x, size_t n, float p, uint64_t mask_stream);
  // Returns the summed loss (copied to the host: a synchronisation point), or 0 with loss_out set.
  double crossentropy_forward(Stat* losses, Stat* lse, const Act* logits, const int32_t* targets,
                              const uint8_t* mask, int N, int V);
  void crossentropy_backward(Act* dlogits, const Act* logits, const Stat* lse, const int32_t* targets,
                             const uint8_t* mask, float dloss, int N, int V);

 private:
  DeviceBuffer<float> rmsnorm_scratch_;
  DeviceBuffer<float> attention_dsum_;
  DeviceBuffer<int32_t> embedding_plan_;  // the largest plan of N rows: grown once per shape
  UploadStaging embedding_plan_staging_;
  DeviceBuffer<double> loss_sum_;
};

LT_CUDA_NAMESPACE_END
