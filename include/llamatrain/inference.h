// Token-by-token decoding with a KV cache (as llama2.c's run.c), and the sampler.
#pragma once
#include <cstdint>
#include <vector>

#include "llamatrain/model.h"
#include "llamatrain/rng.h"

namespace lt {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Feeds `token` at position `pos` (0-based, pos < the decoder's length; positions fed in order
  // from 0, or again from an earlier one) and returns the next-token logits (V, fp32).
  virtual const std::vector<float>& step(int32_t token, int pos) = 0;
};

// The CPU's decoder, in fp32 (a device's: make_decoder, engine.h).
class CpuDecoder final : public Decoder {
 public:
  // Reads the weights of `model` (which must outlive the decoder); caches up to max_len positions.
  CpuDecoder(const Llama2Model& model, int max_len);
  const std::vector<float>& step(int32_t token, int pos) override;

 private:
  const Llama2Model& model_;
  int max_len_;
  std::vector<float> key_cache_, value_cache_;  // (L, max_len, kv_dim)
  std::vector<float> x_, xn_, q_, att_, tmp_, h1_, h3_, logits_;
};

// temperature 0 -> argmax (lowest index wins ties); otherwise softmax(logits / temperature),
// restricted to the smallest set of tokens whose probability reaches top_p when 0 < top_p < 1.
class Sampler {
 public:
  Sampler(float temperature, float top_p, uint64_t seed) : temperature_(temperature), top_p_(top_p), rng_(seed) {}
  int32_t sample(const std::vector<float>& logits);

 private:
  float temperature_, top_p_;
  Rng rng_;
};

}  // namespace lt
