// Token-by-token decoding on the CUDA backend (generate --device cuda|cuda-sim, eval's generated
// answers): the twin of lt::CpuDecoder (include/llamatrain/inference.h) with the model's bf16
// weights and a bf16 KV cache in device memory. Compiled in both builds (see device.h).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/pass_ops.h"
#include "llamatrain/inference.h"
#include "llamatrain/model.h"

LT_CUDA_NAMESPACE_BEGIN

// Per token: the token and its position copied up (8 bytes), the ops of the training pass
// (pass_ops.h) on one row, the keys and values appended to the cache and the decoding attention
// kernel (kernels/attention_decode.cuh) over it, and the logits, computed in fp32, copied down.
class CudaDecoder final : public Decoder {
 public:
  // Copies `model`'s weights to the device (rounded to bf16; the host's may go after); caches up to
  // max_len positions, (n_layers, max_len, kv_dim) bf16 each for keys and values.
  CudaDecoder(const Llama2Model& model, int max_len);
  const std::vector<float>& step(int32_t token, int pos) override;

 private:
  // Layer l's attention and feed-forward on x for position pos (ids_: the token, then pos).
  void layer_step(int l, int pos);

  Llama2Config cfg_;
  ParameterLayout layout_;
  int max_len_;
  PassOps ops_;
  DeviceBuffer<__nv_bfloat16> params_, k_cache_, v_cache_;
  DeviceBuffer<__nv_bfloat16> x_, xn_, q_, att_, tmp_, h1_, h3_, hs_;
  DeviceBuffer<float> rstd_, logits_;
  DeviceBuffer<int32_t> ids_;
  std::vector<float> host_logits_;
};

LT_CUDA_NAMESPACE_END
