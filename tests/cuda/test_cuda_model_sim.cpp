// The CUDA backend's model (src/backend/cuda/cuda_model.h) with every kernel in the simulator and
// the matrix products on the CPU BLAS (--device cuda-sim), against the CPU backend's Llama2Model
// on the same bf16-rounded weights and the same packed batch (RoPE positions and attention
// restarting at example boundaries, a loss mask).
// Tolerances (bf16 storage, fp32 accumulation, STYLE.md): the loss within 1e-2 relative; every
// gradient tensor within 5e-2 of the CPU's in relative L2 norm (each activation is rounded to
// bf16, 2^-9 relative, at some 30 points of a 2-layer pass, and the errors add up in the weight
// gradients' reductions); the worst tensor and element are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/pass_ops.h"
#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/ops_cpu.h"

namespace {

float bf(float v) { return __bfloat162float(__float2bfloat16(v)); }

// A packed batch: B rows of T tokens, each row holding examples of the given lengths (positions and
// first visible key restart at each), loss on the second half of every example.
struct PackedBatch {
  int B, T;
  std::vector<int32_t> inputs, targets, pos, seg_start;
  std::vector<uint8_t> mask;
  PackedBatch(int b, int t, const std::vector<int>& lengths, int V, uint32_t seed) : B(b), T(t) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> tok(0, V - 1);
    const size_t n = size_t(B) * T;
    inputs.resize(n);
    targets.resize(n);
    pos.resize(n);
    seg_start.resize(n);
    mask.resize(n);
    for (int r = 0; r < B; ++r) {
      int start = 0, li = r;
      while (start < T) {
        const int len = std::min(lengths[size_t(li++) % lengths.size()], T - start);
        for (int i = 0; i < len; ++i) {
          const size_t k = size_t(r) * T + start + i;
          inputs[k] = tok(rng);
          targets[k] = tok(rng);
          pos[k] = i;
          seg_start[k] = start;
          mask[k] = i >= len / 2;
        }
        start += len;
      }
    }
  }
  lt::Batch view() const {
    lt::Batch b;
    b.B = B;
    b.T = T;
    b.inputs = inputs.data();
    b.targets = targets.data();
    b.loss_mask = mask.data();
    b.pos = pos.data();
    b.seg_start = seg_start.data();
    return b;
  }
  int loss_tokens() const { return int(std::count(mask.begin(), mask.end(), 1)); }
};

lt::Llama2Config small_config() {
  lt::Llama2Config c = lt::preset_config("tiny");  // dim 64, 2 layers, 4 heads, 2 KV heads: head_dim 16
  return c;
}

TEST(CudaSimModel, LossAndGradientsMatchTheCpuBackend) {
  const uint32_t seed = 20261129;
  std::printf("[cuda-sim model] seed=%u\n", seed);
  const lt::Llama2Config cfg = small_config();
  lt::Llama2Model cpu(cfg);
  cpu.init_random(seed);
  for (float& w : cpu.params()) w = bf(w);  // both backends start from the same bf16 weights
  cpu.allocate_grads();

  lt::cuda::CudaModel dev(cfg);
  dev.set_params(cpu.params().data());

  const PackedBatch pb(2, 48, {13, 20, 7, 30}, cfg.vocab_size, seed + 1);
  const lt::Batch batch = pb.view();
  const int n = pb.B * pb.T;
  std::vector<float> cpu_tok(n), dev_tok(n);
  const double cpu_loss = cpu.forward(batch, cpu_tok.data());
  const double dev_loss = dev.forward(batch, dev_tok.data());
  std::printf("[cuda-sim model] loss sum: cpu %.6f cuda-sim %.6f (%d loss tokens)\n", cpu_loss, dev_loss,
              pb.loss_tokens());
  ASSERT_TRUE(std::isfinite(dev_loss));
  EXPECT_NEAR(dev_loss, cpu_loss, 1e-2 * std::fabs(cpu_loss));
  double worst_tok = 0;
  int worst_i = 0;
  for (int i = 0; i < n; ++i) {
    if (!pb.mask[size_t(i)]) {
      EXPECT_EQ(dev_tok[size_t(i)], 0.f) << "masked token " << i;
      continue;
    }
    const double e = std::fabs(dev_tok[size_t(i)] - cpu_tok[size_t(i)]);
    if (e > worst_tok) worst_tok = e, worst_i = i;
  }
  std::printf("[cuda-sim model] per-token loss worst |err| %.3e at %d (cpu %.5f)\n", worst_tok, worst_i,
              cpu_tok[size_t(worst_i)]);
  EXPECT_LT(worst_tok, 5e-2 * std::max(1.0, double(cpu_tok[size_t(worst_i)])));

  const float dloss = 1.0f / float(pb.loss_tokens());
  cpu.backward(batch, dloss);
  dev.backward(batch, dloss);
  std::vector<float> dev_grads(cpu.layout().total());
  dev.grads_to_host(dev_grads.data());

  double worst_rel = 0;
  std::string worst_name;
  for (const auto& t : cpu.layout().tensors()) {
    double num = 0, den = 0;
    size_t worst_k = 0;
    double worst_e = -1;
    for (size_t i = 0; i < t.numel; ++i) {
      const double g = dev_grads[t.offset + i], r = cpu.grads()[t.offset + i];
      ASSERT_TRUE(std::isfinite(g)) << t.name << "[" << i << "]";
      num += (g - r) * (g - r);
      den += r * r;
      if (std::fabs(g - r) > worst_e) worst_e = std::fabs(g - r), worst_k = i;
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    std::printf("[cuda-sim model] d%-34s rel L2 %.3e, worst |err| %.3e at %zu (cpu %.4e)\n", t.name.c_str(), rel,
                worst_e, worst_k, double(cpu.grads()[t.offset + worst_k]));
    ASSERT_GT(den, 0.0) << t.name << ": the CPU gradient is zero, the comparison would prove nothing";
    if (rel > worst_rel) worst_rel = rel, worst_name = t.name;
    EXPECT_LT(rel, 5e-2) << "gradient of " << t.name;
  }
  std::printf("[cuda-sim model] worst gradient tensor: %s (rel L2 %.3e)\n", worst_name.c_str(), worst_rel);
}

// Five AdamW steps on each backend from the same weights and batches: the losses agree within
// bf16 tolerance at every step and fall on both (fp32 master weights on the host for both; the
// CUDA model takes the bf16 working copy after each update).
TEST(CudaSimModel, TrainingStepsFollowTheCpuLosses) {
  const uint32_t seed = 7;
  std::printf("[cuda-sim train] seed=%u\n", seed);
  const lt::Llama2Config cfg = small_config();
  lt::Llama2Model cpu(cfg);
  cpu.init_random(seed);
  for (float& w : cpu.params()) w = bf(w);
  cpu.allocate_grads();
  lt::cuda::CudaModel dev(cfg);

  const size_t P = cpu.layout().total();
  std::vector<float> master = cpu.params();  // the CUDA side's fp32 master weights
  std::vector<float> m_cpu(P), v_cpu(P), m_dev(P), v_dev(P), g_dev(P);
  const PackedBatch pb(2, 32, {32}, cfg.vocab_size, seed + 1);  // the same batch every step: losses must fall
  const lt::Batch batch = pb.view();
  const float dloss = 1.0f / float(pb.loss_tokens());
  std::vector<double> cpu_losses, dev_losses;
  for (int step = 1; step <= 5; ++step) {
    cpu.zero_grads();
    cpu_losses.push_back(cpu.forward(batch) * dloss);
    cpu.backward(batch, dloss);
    lt::cpu::adamw_update(cpu.params().data(), m_cpu.data(), v_cpu.data(), cpu.grads().data(), P, 3e-3f, 0.9f,
                          0.95f, 1e-8f, 0.0f, step);

    dev.set_params(master.data());
    dev.zero_grads();
    dev_losses.push_back(dev.forward(batch) * dloss);
    dev.backward(batch, dloss);
    dev.grads_to_host(g_dev.data());
    lt::cpu::adamw_update(master.data(), m_dev.data(), v_dev.data(), g_dev.data(), P, 3e-3f, 0.9f, 0.95f, 1e-8f,
                          0.0f, step);
    std::printf("[cuda-sim train] step %d loss cpu %.6f cuda-sim %.6f\n", step, cpu_losses.back(), dev_losses.back());
    EXPECT_NEAR(dev_losses.back(), cpu_losses.back(), 1e-2 * cpu_losses.back()) << "step " << step;
  }
  EXPECT_LT(dev_losses.back(), dev_losses.front() - 0.05) << "the CUDA-sim model did not learn";
  EXPECT_LT(cpu_losses.back(), cpu_losses.front() - 0.05);
}

TEST(CudaSimModel, RejectsAnUnsupportedHeadDimAndBadIds) {
  lt::Llama2Config cfg = small_config();
  cfg.n_heads = 8;  // head_dim 8: no attention instantiation
  cfg.n_kv_heads = 4;
  EXPECT_THROW({ lt::cuda::CudaModel m(cfg); }, lt::Error);

  const lt::Llama2Config ok = small_config();
  lt::cuda::CudaModel dev(ok);
  PackedBatch pb(1, 8, {8}, ok.vocab_size, 1);
  pb.inputs[3] = ok.vocab_size;  // out of range
  try {
    dev.forward(pb.view());
    FAIL() << "an out-of-range token id was accepted";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 512 at position 3"), std::string::npos) << e.what();
  }
}

// --attention cudnn: cuDNN runs only on a GPU, so the simulator's model refuses it, saying so; our
// attention stays selectable.
TEST(CudaSimModel, CudnnAttentionIsRefusedInTheSimulator) {
  lt::cuda::CudaModel model(small_config());
  try {
    model.set_attention(lt::cuda::Attention::kCudnn);
    ADD_FAILURE() << "set_attention(kCudnn) must throw in the simulator build";
  } catch (const lt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--attention cudnn runs only on a GPU"), std::string::npos) << what;
    EXPECT_NE(what.find("--attention native"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(model.set_attention(lt::cuda::Attention::kNative));
}

}  // namespace
