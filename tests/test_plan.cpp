// The cluster planner: memory figures for Llama-2-7b against hand arithmetic, the executed FLOPs,
// the ring formulas, the balanced split, CPU ranks' threads as train takes them, calibration
// recovering known rates (and their threads) from synthetic metrics, the reference deployment's published epoch times within 25% (uncalibrated), and bad
// input reported with the file, line and field.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/plan.h"
#include "test_util.h"

namespace lt {
namespace {

using testing::error_of;

const std::string kHostfiles = std::string(LLAMATRAIN_SOURCE_DIR) + "/hostfiles";

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// A number as JSON text without losing precision (strcat prints 6 digits).
std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The reference deployment (docs/planning.md): Llama-2-7b, context 512, PubMedQA
// pqa_artificial's 211,269 examples with a 0.2 test split = 169,015 training sequences of 512
// tokens (one example per padded sequence). Our job on their hardware: ZeRO 1, full recompute
// (their batch of 32 or 126 sequences per GPU only fits with activation checkpointing). ZeRO 1
// reduce-scatters the gradient once per step, so the balanced split's many small micro-batches
// cost no extra collectives; ZeRO 2 (true: the gradient only as the shard) reduces every
// micro-batch round, which on this 100 Gb/s network makes balancing cost more than it saves.
PlanOptions reference_job(int64_t global_batch, int np) {
  PlanOptions o;
  o.model = preset_config("llama2-7b");
  o.model_name = "llama2-7b";
  o.seq_len = 512;
  o.global_batch = global_batch;
  o.zero_stage = 1;
  o.recompute = Recompute::kFull;
  o.train_sequences = 169015;
  o.np = np;
  return o;
}

// The reference job for Llama-2-70b with ZeRO 3 and bf16 gradient shards.
PlanOptions llama70b_zero3_bf16_job(int np) {
  PlanOptions o = reference_job(2016, np);
  o.model = preset_config("llama2-70b");
  o.zero_stage = 3;
  o.bf16_grads = true;
  return o;
}

// ZeRO 3 (planned for GPUs from the CPU's implementation): every rank holds a shard of the bf16
// weights, of the fp32 gradient and of master + Adam, and one layer's gathered bf16 weights and
// fp32 gradient scratch (6 B x 202,383,360); the reference job then takes one micro-batch of 126
// per rank (fewest reduction rounds), and Llama-2-70b fits no stage on the 16 x 80 GB cluster.
TEST(PlanMemory, Llama7bZero3SixteenRanksByHand) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  PlanOptions o = reference_job(2016, 0);
  o.zero_stage = 3;
  const PlanResult p = make_plan(hf, o, default_plan_constants());
  ASSERT_EQ(p.ranks.size(), 16u);
  for (const PlanRank& r : p.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.params, 2.0 * 421150976.0);
    EXPECT_DOUBLE_EQ(r.memory.grads, 4.0 * 421150976.0);
    EXPECT_DOUBLE_EQ(r.memory.optimizer, 12.0 * 421150976.0);
    // A layer's bf16 weights and fp32 gradient scratch, and the next layer's bf16 weights (prefetch).
    EXPECT_DOUBLE_EQ(r.memory.gathered, 8.0 * 202383360.0);
  }
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.balanced.micro_batch, 126);
  bool noted = false;
  for (const std::string& n : p.notes) noted |= n.find("like all of --device cuda it has run on the simulator only so far") != std::string::npos;
  EXPECT_TRUE(noted);
  PlanOptions big = o;
  big.model = preset_config("llama2-70b");
  for (int stage : {1, 2, 3}) {
    big.zero_stage = stage;
    EXPECT_FALSE(make_plan(hf, big, default_plan_constants()).fits) << "70B, ZeRO " << stage;
  }
}

// LoRA (issue 36), rank 16 on every product of Llama-2-7b, the reference job (ZeRO 1, full
// recompute): each GPU holds the frozen base in bf16 and the adapters' bf16 copy and their fp32
// gradients; their fp32 master and Adam m, v are the host's, which updates them (the optimizer
// column is 0; the step pays the host's update and the copies); a token's FLOPs lose the base's
// weight gradients (2 per parameter) and gain the adapters' 6 per adapter parameter; the step's
// collectives move only the adapters.
TEST(PlanLora, Llama7bReferenceJobByHand) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  PlanOptions o = reference_job(2016, 0);
  const PlanResult full = make_plan(hf, o, default_plan_constants());
  o.lora.rank = 16;
  o.lora.alpha = 32;
  const PlanResult lora = make_plan(hf, o, default_plan_constants());
  // 32 layers x 16 x (4 x (4096 + 4096) for wq, wk, wv, wo + 3 x (4096 + 11008) for w1, w2, w3)
  const double n = 32.0 * 16 * (4 * 8192 + 3 * 15104), N = 6738415616.0;
  ASSERT_EQ(n, 39976960.0);
  for (const PlanRank& r : lora.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.params, 2.0 * N + 2.0 * n);
    EXPECT_DOUBLE_EQ(r.memory.grads, 4.0 * n);
    EXPECT_DOUBLE_EQ(r.memory.optimizer, 0.0);
    const int b = std::max(lora.equal.micro_batch, lora.balanced.micro_batch);  // where memory is planned
    EXPECT_DOUBLE_EQ(r.memory.activations, plan_activation_bytes(o.model, b, 512, Recompute::kFull, 2) +
                                               2.0 * b * 512 * (32 * 7) * 16);
  }
  EXPECT_DOUBLE_EQ(lora.flops_per_token, full.flops_per_token - 2 * N + 6 * n);
  // The host's update: AdamW's 30 bytes per owned adapter parameter (39976960 = 16 x 2498560: no
  // padding) at 100 GB/s shared by the node's ranks (8 on the XE9680), and 6 bytes per adapter
  // parameter copied (fp32 gradients down, bf16 copy up) at 12 GB/s.
  const double host_s = 2498560.0 * 30 / (100e9 / 8) + n * 6 / 12e9;
  std::printf("host update of the adapters: %.4f s per step (planned %.4f s)\n", host_s, lora.balanced.optimizer_s);
  EXPECT_NEAR(lora.balanced.optimizer_s, host_s, 1e-12);
  std::printf("reference job: full fine-tuning %.0f s/epoch (collectives %.3f s/step), LoRA r16 %.0f s/epoch "
              "(collectives %.4f s/step); GPU memory per rank %.1f vs %.1f GiB\n",
              full.balanced.epoch_s, full.balanced.collectives_s, lora.balanced.epoch_s, lora.balanced.collectives_s,
              full.ranks[0].memory.total() / double(1ull << 30), lora.ranks[0].memory.total() / double(1ull << 30));
  EXPECT_LT(lora.balanced.collectives_s, full.balanced.collectives_s / 50);
  EXPECT_LT(lora.balanced.epoch_s, full.balanced.epoch_s);
  EXPECT_TRUE(lora.fits);
}

// Llama-2-70b with LoRA rank 16 on every product, one node of 8 x 80 GB (the reference cluster's
// first 8 ranks, A100 80 GB: an 8 x H100 80 GB node has the same memory), full recompute. At ZeRO 1
// every rank holds the frozen base whole (2 B x 68,976,648,192 = 128.5 GiB) and nothing fits; ZeRO
// 3 keeps each rank's shard of it (N / 8 in bf16) and the blocks gathered at once (two layers of
// 855,654,400 bf16 weights: the one in use and the next, prefetched; no gradient scratch: the base
// has no gradients), the adapters at stage 1 (their bf16 copy and fp32 gradients whole; their
// master and Adam state on the host, which updates them); each
// micro-batch round gathers the base twice (forward, and backward without the embeddings), and the
// adapters are reduce-scattered and gathered once per step.
TEST(PlanLora, Llama70bZero3FitsOneNodeByHand) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  PlanOptions o = llama70b_zero3_bf16_job(8);
  o.bf16_grads = false;
  o.lora.rank = 16;
  o.lora.alpha = 32;
  const double N = 68976648192.0, layer = 855654400.0;
  // 80 layers x 16 x (wq, wo: 8192 + 8192; wk, wv: 8192 + 1024; w1, w2, w3: 8192 + 28672)
  const double n = 80.0 * 16 * (2 * 16384 + 2 * 9216 + 3 * 36864);
  ASSERT_EQ(n, 207093760.0);
  PlanOptions z1 = o;
  z1.zero_stage = 1;
  const PlanResult p1 = make_plan(hf, z1, default_plan_constants());
  EXPECT_FALSE(p1.fits);
  bool said = false;
  for (const std::string& note : p1.notes) said |= note.find("LoRA holds the frozen base whole") == 0;
  EXPECT_TRUE(said) << "ZeRO 1's plan does not say why it does not fit";
  const PlanResult p = make_plan(hf, o, default_plan_constants());
  ASSERT_EQ(p.ranks.size(), 8u);
  for (const PlanRank& r : p.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.params, 2.0 * N / 8 + 2.0 * n);  // N and n are multiples of 8: no padding
    EXPECT_DOUBLE_EQ(r.memory.gathered, 2.0 * 2 * layer);  // the layer in use and the next (--zero3-prefetch 1)
    EXPECT_DOUBLE_EQ(r.memory.grads, 4.0 * n);
    EXPECT_DOUBLE_EQ(r.memory.optimizer, 0.0);  // the host's (register.cu)
  }
  EXPECT_TRUE(p.fits);
  std::printf("70B LoRA r16 on 8 x 80 GB, ZeRO 3: micro-batch %d, %.1f GiB per rank, step %.1f s (collectives %.1f s), "
              "epoch %.2f h\n", p.equal.micro_batch, p.ranks[0].memory.total() / double(1ull << 30), p.equal.step_s,
              p.equal.collectives_s, p.equal.epoch_s / 3600);
  EXPECT_GT(p.equal.collectives_s, 0.0);
}

// Llama-2-70b on the 16 x 80 GB reference GPUs: ZeRO 3 with bf16 gradient shards
// (--grad-reduce-dtype bf16) holds the ZeRO paper's 16 bytes per parameter over 16 ranks, plus one
// layer's gathered bf16 weights and fp32 gradient scratch, and fits at micro-batch 3 without
// prefetch, 1 with it (the next layer's bf16 weights too); fp32 gradient shards (2 bytes more per
// parameter and rank) do not fit, and no stage fits one node of 8.
TEST(PlanMemory, Llama70bZero3Bf16GradientsFitSixteenRanksByHand) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  PlanOptions o = llama70b_zero3_bf16_job(0);
  o.zero3_prefetch = 0;  // with the next block's gather issued early, below
  // N = 32000*8192*2 + 80 * (2*8192 + 2*8192^2 + 2*8192*1024 + 3*8192*28672) + 8192
  //   = 524,288,000 + 80 * 855,654,400 + 8,192 = 68,976,648,192 = 16 * 4,311,040,512.
  ASSERT_EQ(o.model.num_parameters(), 68976648192LL);
  const double shard = 4311040512.0, layer = 855654400.0;
  const PlanResult p = make_plan(hf, o, default_plan_constants());
  ASSERT_EQ(p.ranks.size(), 16u);
  // Room for activations: 0.9 * 80 GiB - 16 * shard - 6 * layer = 3,198,836,736 B. Full recompute,
  // per token: residual 81 * 8192 * 2 = 1,327,104; a layer's working set (5C + 2kv + 3F) * 2 +
  // (2 + H) * 4 = 258,312; final norm 16,384; bf16 logits 64,000; 3 fp32 scalars 12; backward
  // scratch 258,048: 1,923,860 B per token, 985,016,320 per sequence of 512: 3 sequences fit.
  for (const PlanRank& r : p.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.params, 2.0 * shard);
    EXPECT_DOUBLE_EQ(r.memory.grads, 2.0 * shard);
    EXPECT_DOUBLE_EQ(r.memory.optimizer, 12.0 * shard);
    EXPECT_DOUBLE_EQ(r.memory.gathered, 6.0 * layer);
    EXPECT_EQ(r.max_micro_batch, 3);
    EXPECT_DOUBLE_EQ(r.memory.activations, 3.0 * 512 * 1923860);
    EXPECT_TRUE(r.fits);
  }
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.equal.micro_batch, 3);
  EXPECT_EQ(p.equal.k, std::vector<int>(16, 42));
  // Balancing by speed would put more rounds of collectives on the H100s (3082 s per step against
  // 1865 s): the balanced plan keeps the equal split.
  EXPECT_EQ(p.balanced.k, p.equal.k);
  // Prefetch (the default) holds one more layer's bf16 weights: 2 * layer less room, 1,487,527,936
  // B, 1 sequence.
  PlanOptions ahead = o;
  ahead.zero3_prefetch = 1;
  const PlanResult pa = make_plan(hf, ahead, default_plan_constants());
  for (const PlanRank& r : pa.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.gathered, 8.0 * layer);
    EXPECT_EQ(r.max_micro_batch, 1);
  }
  EXPECT_TRUE(pa.fits);
  EXPECT_EQ(pa.equal.micro_batch, 1);
  bool offered = false;
  for (const std::string& n : pa.notes) {
    std::printf("note: %s\n", n.c_str());
    // Epochs of 3 hours or more in hours (plan_duration_text), as docs/planning.md's table has them.
    offered |= n.find("with --zero3-prefetch 0 micro-batch 3 fits and an epoch takes 43.0 h instead of 118.1 h") !=
               std::string::npos;
  }
  EXPECT_TRUE(offered) << "the plan does not say what --zero3-prefetch 0 gives";
  PlanOptions fp32 = o;
  fp32.bf16_grads = false;
  EXPECT_FALSE(make_plan(hf, fp32, default_plan_constants()).fits) << "fp32 gradient shards";
  PlanOptions node = o;
  node.np = 8;
  for (int stage : {1, 2, 3}) {
    node.zero_stage = stage;
    EXPECT_FALSE(make_plan(hf, node, default_plan_constants()).fits) << "8 ranks, ZeRO " << stage;
  }
}

// One node of 8 A100-80GB (an 8 x H100-80GB node has the same memory) holds 70B with the optimizer
// offloaded to the host (--offload-optimizer): ZeRO 3, bf16 gradient shards, the default prefetch.
// Per rank: the shard N / 8 = 8,622,081,024 of bf16 weights and bf16 gradients, no optimizer state,
// two layers' bf16 weights and one layer's fp32 scratch (8 B x 855,654,400), so the room for
// activations is 0.9 * 80 GiB - 4 * shard - 8 * layer = 35,975,852,032 B: 36 sequences of
// 985,016,320 B. The optimizer's time is the host's AdamW over the shard, 30 B per parameter at
// host_memory_gbps shared by the node's 8 ranks, plus the bf16 gradient shard down and the bf16
// weights up (2 + 2 B per parameter) at host_copy_gbps.
TEST(PlanMemory, Llama70bWithTheOptimizerOffloadedFitsOneNodeByHand) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  PlanOptions o = llama70b_zero3_bf16_job(8);
  o.offload_optimizer = true;
  const double shard = 68976648192.0 / 8, layer = 855654400.0;
  const PlanConstants& c = default_plan_constants();
  const PlanResult p = make_plan(hf, o, c);
  ASSERT_EQ(p.ranks.size(), 8u);
  for (const PlanRank& r : p.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.params, 2.0 * shard);
    EXPECT_DOUBLE_EQ(r.memory.grads, 2.0 * shard);
    EXPECT_DOUBLE_EQ(r.memory.optimizer, 0.0);
    EXPECT_DOUBLE_EQ(r.memory.gathered, 8.0 * layer);
    EXPECT_EQ(r.max_micro_batch, 36);
    EXPECT_TRUE(r.fits);
  }
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.equal.micro_batch, 36);
  const double host_s = shard * c.adamw_bytes_per_param / (c.host_memory_gbps * 1e9 / 8) + shard * 4.0 / (c.host_copy_gbps * 1e9);
  EXPECT_NEAR(p.equal.optimizer_s, host_s, 1e-9 * host_s);
  std::printf("70B on 8 ranks, offloaded optimizer: micro-batch %d, step %.1f s (optimizer on the host %.2f s), "
              "epoch %.2f h\n", p.equal.micro_batch, p.equal.step_s, p.equal.optimizer_s, p.equal.epoch_s / 3600);
  bool said = false;
  for (const std::string& n : p.notes) said |= n.find("--offload-optimizer: each GPU rank's fp32 master") == 0;
  EXPECT_TRUE(said);
  // Without the option it does not fit, and the plan says what the option would give.
  PlanOptions resident = o;
  resident.offload_optimizer = false;
  const PlanResult pr = make_plan(hf, resident, c);
  EXPECT_FALSE(pr.fits);
  bool offered = false;
  for (const std::string& n : pr.notes) {
    std::printf("note: %s\n", n.c_str());
    offered |= n.find("with --offload-optimizer (fp32 master weights and Adam m, v in host memory) micro-batch 36 "
                      "fits and an epoch takes 11.7 h") == 0;
  }
  EXPECT_TRUE(offered) << "the plan does not say what --offload-optimizer gives";
  PlanOptions zero0 = o;
  zero0.zero_stage = 0;
  const std::string err = error_of([&] { make_plan(hf, zero0, c); });
  EXPECT_NE(err.find("--offload-optimizer needs --zero 1, 2 or 3"), std::string::npos) << err;
}

TEST(PlanMemory, Llama7bZero2SixteenRanksByHand) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  PlanOptions o = reference_job(2016, 0);
  o.zero_stage = 2;
  o.micro_batch = 126;
  const PlanResult p = make_plan(hf, o, default_plan_constants());
  ASSERT_EQ(p.ranks.size(), 16u);
  // N = 32000*4096*2 + 32 * (2*4096 + 4*4096^2 + 3*4096*11008) + 4096 = 6,738,415,616, a multiple
  // of 16, so every shard holds N / 16 = 421,150,976 parameters.
  EXPECT_EQ(o.model.num_parameters(), 6738415616LL);
  for (const PlanRank& r : p.ranks) {
    EXPECT_DOUBLE_EQ(r.memory.params, 2.0 * 6738415616.0);       // bf16 working copy: 13,476,831,232 B
    EXPECT_DOUBLE_EQ(r.memory.grads, 4.0 * 421150976.0);         // fp32 gradients of the shard only
    EXPECT_DOUBLE_EQ(r.memory.optimizer, 12.0 * 421150976.0);    // fp32 master + m + v of the shard
    // One block's fp32 gradient scratch: a layer, 2*4096 + 4*4096^2 + 3*4096*11008 = 202,383,360
    // (wider than the head, 4096 + 32000*4096; the embeddings are untied).
    EXPECT_DOUBLE_EQ(r.memory.gathered, 4.0 * 202383360.0);
    // Full recompute, per token: the residual stream (L+1)*C*2 = 270,336; one layer's working set
    // (5C + 2kv + 3F)*2 + (2 + H)*4 = 123,528; final norm C*2 = 8,192, bf16 logits 2V = 64,000,
    // 3 fp32 scalars 12, backward scratch (5C + 2kv + 3F)*2 = 123,392: 589,460 B per token,
    // 126 * 512 tokens.
    EXPECT_DOUBLE_EQ(r.memory.activations, 126.0 * 512 * 589460);
    EXPECT_DOUBLE_EQ(r.capacity_bytes, 80.0 * 1024 * 1024 * 1024 * 0.9);
    // 21.0 GB of state + 38.0 GB of activations fit in 77.3 GB: DeepSpeed's micro-batch of 126 fits
    // with true ZeRO 2 (it did not beside a whole fp32 gradient, 27 GB more); the largest that
    // fits is what the capacity leaves.
    EXPECT_TRUE(r.fits);
    const double state = 2.0 * 6738415616.0 + 16.0 * 421150976.0 + 4.0 * 202383360.0 + 32.0 * 1024 * 1024;
    EXPECT_EQ(r.max_micro_batch, int((r.capacity_bytes - state) / (512.0 * 589460)));
  }
  // The gradient is reduce-scattered every micro-batch round, the weights all-gathered once: one
  // round at 126, two at 63 (10 GB/s rings, as PlanRing.CollectiveFormulas).
  const double gather = 15.0 / 16 * 2 * 6738415616.0 / 10e9 + 15 * 20e-6;
  const double reduce = 15.0 / 16 * 4 * 6738415616.0 / 10e9 + 15 * 20e-6;
  EXPECT_NEAR(p.equal.collectives_s, reduce + gather, 1e-9);
  PlanOptions half = o;
  half.micro_batch = 63;
  EXPECT_NEAR(make_plan(hf, half, default_plan_constants()).equal.collectives_s, 2 * reduce + gather, 1e-9);
  // ZeRO 0 on 4 A100: 2 + 4 + 12 = 18 B per parameter = 121.3 GB of static state: no micro-batch fits.
  PlanOptions z0 = reference_job(128, 4);
  z0.zero_stage = 0;
  const PlanResult p0 = make_plan(hf, z0, default_plan_constants());
  EXPECT_FALSE(p0.fits);
  EXPECT_DOUBLE_EQ(p0.ranks[0].memory.optimizer, 12.0 * 6738415616.0);
  EXPECT_EQ(p0.ranks[0].max_micro_batch, 0);
  ASSERT_FALSE(p0.notes.empty());
  EXPECT_NE(p0.notes[0].find("no micro-batch fits"), std::string::npos) << p0.notes[0];
}

TEST(PlanMemory, CpuActivationsMatchCpuBackend) {
  const Llama2Config cfg = preset_config("tiny");
  Llama2Model model(cfg);
  for (Recompute r : {Recompute::kNone, Recompute::kAttn, Recompute::kFull}) {
    model.set_recompute(r);
    for (int b : {1, 4})
      EXPECT_DOUBLE_EQ(plan_activation_bytes(cfg, b, 128, r, 4), double(model.activation_bytes(b, 128)))
          << recompute_name(r) << " b=" << b;
  }
}

TEST(PlanFlops, RecomputeAddsTheRepeatedForward) {
  const Llama2Config cfg = preset_config("llama2-7b");
  // 6 N' + 12 L C T with N' = N - V C (the embedding is a lookup): 39,644,061,696 + 805,306,368.
  EXPECT_DOUBLE_EQ(executed_flops_per_token(cfg, 512, Recompute::kNone), 40449368064.0);
  // full: + 2 L (2C^2 + 2C kv + 2CF) = 10,066,329,600 (not w2: the layer's output is kept) and
  // + 4 L C T = 268,435,456.
  EXPECT_DOUBLE_EQ(executed_flops_per_token(cfg, 512, Recompute::kFull), 40449368064.0 + 10066329600.0 + 268435456.0);
  // attn: + 2 L C (C + 2 kv) = 3,221,225,472 and + 4 L C T.
  EXPECT_DOUBLE_EQ(executed_flops_per_token(cfg, 512, Recompute::kAttn), 40449368064.0 + 3221225472.0 + 268435456.0);
}

TEST(PlanRing, CollectiveFormulas) {
  // 1 GB over 4 ranks at 10 GB/s: all-reduce 2 * 3/4 * 0.1 s, reduce-scatter 3/4 * 0.1 s, plus
  // 2(W-1) or (W-1) latencies.
  EXPECT_DOUBLE_EQ(ring_allreduce_s(1e9, 4, 10, 0), 0.15);
  EXPECT_DOUBLE_EQ(ring_reduce_scatter_s(1e9, 4, 10, 0), 0.075);
  EXPECT_DOUBLE_EQ(ring_allreduce_s(1e9, 4, 10, 1e-3), 0.156);
  EXPECT_DOUBLE_EQ(ring_reduce_scatter_s(1e9, 4, 10, 1e-3), 0.078);
  EXPECT_EQ(ring_allreduce_s(1e9, 1, 10, 1e-3), 0.0);
  // The reference cluster, ZeRO 1: reduce-scatter of fp32 gradients + all-gather of bf16
  // parameters over the 100 Gb/s NICs at link_efficiency 0.8 = 10 GB/s, once per step.
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  const PlanResult p = make_plan(hf, reference_job(2016, 0), default_plan_constants());
  EXPECT_DOUBLE_EQ(p.ring_gbps, 10.0);
  EXPECT_NE(p.ring_link.find("100 Gb/s NIC"), std::string::npos) << p.ring_link;
  const double gather = 15.0 / 16 * 2 * 6738415616.0 / 10e9 + 15 * 20e-6;
  const double reduce = 15.0 / 16 * 4 * 6738415616.0 / 10e9 + 15 * 20e-6;
  EXPECT_NEAR(p.equal.collectives_s, reduce + gather, 1e-12);
  // One host of A100 SXM: the NVLink ring, 300 GB/s x 0.8.
  const PlanResult p4 = make_plan(hf, reference_job(128, 4), default_plan_constants());
  EXPECT_DOUBLE_EQ(p4.ring_gbps, 240.0);
}

TEST(PlanRing, ExpectedSlowestRankUnderNoise) {
  // No variation: the slowest mean; ranks without micro-batches do not count.
  EXPECT_DOUBLE_EQ(expected_max_compute({1.0, 2.0, 0.0}, 0.0, 0.0), 2.0);
  // Two equal ranks, independent normal noise of 20%: E max = mu + sigma sqrt(2) phi(0).
  const double phi0 = 1 / std::sqrt(2 * 3.14159265358979323846);
  EXPECT_NEAR(expected_max_compute({1.0, 1.0}, 0.2, 0.0), 1 + 0.2 * std::sqrt(2.0) * phi0, 1e-12);
  // Anti-correlated (rho = -0.5): theta = sigma sqrt(2 + 1).
  EXPECT_NEAR(expected_max_compute({1.0, 1.0}, 0.2, -0.5), 1 + 0.2 * std::sqrt(3.0) * phi0, 1e-12);
  // Three independent: E max of 3 standard normals = 0.846284 (Clark's pairwise rule is close).
  EXPECT_NEAR(expected_max_compute({1.0, 1.0, 1.0}, 0.2, 0.0), 1 + 0.2 * 0.846284, 2e-3);
  // One rank far slower: noise barely matters.
  EXPECT_NEAR(expected_max_compute({1.0, 3.0}, 0.1, 0.0), 3.0, 1e-3);
}

// Two CPU ranks of one node with a known calibrated rate; rank 1 simulated 2x slower.
PlanConstants two_cpu_ranks_at(double gflops) {
  PlanConstants c = default_plan_constants();
  CalibratedRate r;
  r.device = "cpu";
  r.threads = 1;
  r.gflops = gflops;
  r.source = "test";
  c.rates.push_back(r);
  return c;
}

TEST(PlanSplit, BalancedSplitFollowsSpeed) {
  const Hostfile hf = parse_hostfile_text("localhost slots=2\n", "<test>");
  PlanOptions o;
  o.model = preset_config("tiny");
  o.model_name = "tiny";
  o.seq_len = 128;
  o.global_batch = 24;
  o.micro_batch = 4;
  o.zero_stage = 1;
  o.train_sequences = 1800;
  o.cpu_cores = 2;
  o.slowdown.rank = 1;
  o.slowdown.factor = 2;
  const PlanResult p = make_plan(hf, o, two_cpu_ranks_at(8.0));
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_EQ(p.ranks[0].threads, 1);
  EXPECT_DOUBLE_EQ(p.ranks[1].gflops, 4.0);
  const double t = 4.0 * 128 * executed_flops_per_token(o.model, 128, Recompute::kNone) / 8e9;  // one micro-batch, rank 0
  EXPECT_EQ(p.equal.k, (std::vector<int>{3, 3}));
  EXPECT_EQ(p.balanced.k, (std::vector<int>{4, 2}));
  EXPECT_DOUBLE_EQ(p.equal.compute_s, 3 * 2 * t);
  EXPECT_DOUBLE_EQ(p.balanced.compute_s, 4 * t);
  EXPECT_EQ(p.steps_per_epoch, 75);
  EXPECT_DOUBLE_EQ(p.balanced.epoch_s, 75 * p.balanced.step_s);

  // The reference cluster: 12 A100 at 312 and 4 H100 PCIe at 756 TFLOP/s peak. Equal batches
  // run at the A100's pace; the balanced split comes within 2% of the ideal B T F / sum(rates).
  const Hostfile ref = read_hostfile(kHostfiles + "/reference-cluster");
  const PlanResult q = make_plan(ref, reference_job(2016, 0), default_plan_constants());
  const double F = q.flops_per_token, e = default_plan_constants().gpu_efficiency;
  EXPECT_NEAR(q.equal.compute_s, 126.0 * 512 * F / (312e12 * e), 1e-9);
  const double ideal = 2016.0 * 512 * F / ((12 * 312e12 + 4 * 756e12) * e);
  EXPECT_LE(q.balanced.compute_s, 1.02 * ideal);
  EXPECT_GE(q.balanced.compute_s, ideal * (1 - 1e-12));
  const int b = q.balanced.micro_batch, M = 2016 / b;
  int sum = 0;
  for (int k : q.balanced.k) sum += k;
  EXPECT_EQ(sum, M);
  EXPECT_GT(q.balanced.k[12], 2 * q.balanced.k[0]);  // an H100 PCIe takes ~2.4x an A100's share
}

// The reference deployment's published epoch times, predicted by the uncalibrated model within
// 25% (assumptions in reference_job and in docs/planning.md).
TEST(PlanReference, PublishedEpochTimesWithin25Percent) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  // 4 x A100 80GB (the first 4 slots: one host), batch 32 per GPU, 120 min per epoch.
  const PlanResult a = make_plan(hf, reference_job(4 * 32, 4), default_plan_constants());
  EXPECT_TRUE(a.fits);
  const double ra = a.equal.epoch_s / (120 * 60);
  EXPECT_GT(ra, 0.75);
  EXPECT_LT(ra, 1.25);
  // 12 x A100 + 4 x H100 PCIe, batch 126 per GPU, equal batches (as the reference ran), 46 min.
  const PlanResult b = make_plan(hf, reference_job(16 * 126, 0), default_plan_constants());
  EXPECT_TRUE(b.fits);
  const double rb = b.equal.epoch_s / (46 * 60);
  EXPECT_GT(rb, 0.75);
  EXPECT_LT(rb, 1.25);
  EXPECT_LT(b.balanced.epoch_s, b.equal.epoch_s);
  std::printf("reference: 4xA100 predicted %.1f min / 120 = %.3f; 12xA100+4xH100 predicted %.1f min / 46 = %.3f "
              "(balanced %.1f min)\n",
              a.equal.epoch_s / 60, ra, b.equal.epoch_s / 60, rb, b.balanced.epoch_s / 60);
}

// Issue 35, point 6: a CPU rank runs the threads train would give it: its host line's threads=,
// else OMP_NUM_THREADS (cpu_threads), else the node's cores / its ranks. Uncalibrated, the rate is
// 10 GFLOP/s per thread, so one rank's epoch at 1 thread takes twice its epoch at 2 (no collectives,
// no optimizer time on a CPU): 75 steps of 24 x 128 tokens at F FLOPs each.
TEST(PlanThreads, CpuRanksRunTheThreadsTrainGivesThem) {
  const Hostfile hf = parse_hostfile_text("localhost slots=2\n", "<test>");
  PlanOptions o;
  o.model = preset_config("tiny");
  o.model_name = "tiny";
  o.seq_len = 128;
  o.global_batch = 24;
  o.micro_batch = 4;
  o.train_sequences = 1800;
  o.cpu_cores = 2;
  o.np = 1;
  const double F = executed_flops_per_token(o.model, 128, Recompute::kNone);
  const double step_1thread = 24.0 * 128 * F / 10e9;
  const PlanResult cores = make_plan(hf, o, default_plan_constants());
  EXPECT_EQ(cores.ranks[0].threads, 2);
  EXPECT_EQ(cores.ranks[0].threads_source, "2 cores / 1 rank(s)");
  EXPECT_NEAR(cores.equal.epoch_s, 75 * step_1thread / 2, 1e-12 * step_1thread);
  o.cpu_threads = 1;  // OMP_NUM_THREADS=1
  const PlanResult one = make_plan(hf, o, default_plan_constants());
  EXPECT_EQ(one.ranks[0].threads, 1);
  EXPECT_EQ(one.ranks[0].threads_source, "OMP_NUM_THREADS");
  EXPECT_DOUBLE_EQ(one.ranks[0].gflops, 10.0);
  EXPECT_NEAR(one.equal.epoch_s, 75 * step_1thread, 1e-12 * step_1thread);
  EXPECT_DOUBLE_EQ(one.equal.epoch_s / cores.equal.epoch_s, 2.0);
  EXPECT_TRUE(one.notes.empty()) << one.notes[0];
  // The host line's threads= wins over OMP_NUM_THREADS.
  const PlanResult line = make_plan(parse_hostfile_text("localhost slots=2 # threads=3\n", "<test>"), o,
                                    default_plan_constants());
  EXPECT_EQ(line.ranks[0].threads, 3);
  EXPECT_EQ(line.ranks[0].threads_source, "threads= of <test>:1");
  EXPECT_NEAR(line.equal.epoch_s, 75 * step_1thread / 3, 1e-12 * step_1thread);
  // Two ranks of 2 threads on 2 cores: said, since the rate assumes a core per thread.
  o.np = 2;
  o.cpu_threads = 2;
  const PlanResult over = make_plan(hf, o, default_plan_constants());
  ASSERT_EQ(over.ranks.size(), 2u);
  EXPECT_EQ(over.ranks[1].threads, 2);
  ASSERT_EQ(over.notes.size(), 1u);
  EXPECT_EQ(over.notes[0].rfind("localhost: 2 cpu rank(s) run 4 threads on 2 cores", 0), 0u) << over.notes[0];
}

// A synthetic metrics file of a run whose rates and link are known: the fit recovers them.
TEST(PlanCalibration, RecoversKnownRatesFromSyntheticMetrics) {
  const Llama2Config cfg = preset_config("tiny");
  const double F = executed_flops_per_token(cfg, 128, Recompute::kNone);
  const int64_t tokens = 24 * 128;
  const PlanConstants base = default_plan_constants();
  // One rank (2 threads) at 12 GFLOP/s.
  const std::string one = testing::scratch() + "/np1.jsonl";
  {
    std::string s = strcat("{\"type\":\"memory\",\"world_size\":1,\"zero_stage\":0,\"n_params\":", cfg.num_parameters(),
                           ",\"ranks\":[]}\n");
    // The first step is slow and skipped; the others average 1x the nominal time but their median
    // is 0.75x: the fit is total work / total time (an epoch pays for the slow step too).
    const double scale[] = {3.0, 2.0, 0.75, 0.75, 0.75, 0.75};
    for (int i = 1; i <= 6; ++i) {
      const double ms = scale[i - 1] * tokens * F / 12e9 * 1e3;
      s += strcat("{\"type\":\"step\",\"step\":", i, ",\"tokens\":", tokens, ",\"step_ms\":", num(ms), "}\n");
    }
    write_text(one, s);
  }
  // Two ranks (1 thread each) at 7 GFLOP/s, rank 1 simulated 2x slower, ZeRO 1; the non-compute
  // time of a step is ring reduce-scatter + all-gather of fp32 at 0.5 GB/s.
  const std::string two = testing::scratch() + "/np2.jsonl";
  const double bytes = 4.0 * double(ShardLayout(size_t(cfg.num_parameters()), 2).padded);
  const double comm_s = 2 * ring_reduce_scatter_s(bytes, 2, 0.5, base.link_latency_s);
  {
    std::string s = strcat("{\"type\":\"memory\",\"world_size\":2,\"zero_stage\":1,\"n_params\":", cfg.num_parameters(),
                           ",\"ranks\":[]}\n");
    // Steps 2..7 vary by +-10% around the mean, the two ranks in opposite directions
    // (compute_cv 0.1, compute_correlation -1); the means are the nominal ones.
    for (int i = 1; i <= 7; ++i) {
      const double f = i == 1 ? 1.0 : i % 2 == 0 ? 1.1 : 0.9;
      const double c0 = 4.0 * 4 * 128 * F / 7e9 * 1e3 * f, c1 = 2.0 * 4 * 128 * F / 7e9 * 1e3 * 2 * (2 - f);  // split 4,2
      const double step = std::max(c0, c1) + comm_s * 1e3;
      s += strcat("{\"type\":\"step\",\"step\":", i, ",\"tokens\":", tokens, ",\"step_ms\":", num(step),
                  ",\"split\":[4,2],\"rank_compute_ms\":[", num(c0), ",", num(c1), "],\"rank_wait_ms\":[", num(step - c0), ",", num(step - c1),
                  "]}\n");
    }
    s += "{\"type\":\"epoch\",\"epoch\":0,\"step\":7,\"epoch_time_s\":1.5}\n";
    write_text(two, s);
  }
  const Hostfile hf = parse_hostfile_text("localhost slots=2\n", "<test>");
  CalibrationInput in;
  in.model = cfg;
  in.model_name = "tiny";
  in.seq_len = 128;
  in.cpu_cores = 2;
  in.slowdown.rank = 1;
  in.slowdown.factor = 2;
  std::vector<std::string> report;
  const PlanConstants c = fit_calibration({read_metrics(one), read_metrics(two)}, hf, in, base, &report);
  ASSERT_EQ(c.rates.size(), 2u);
  for (const CalibratedRate& r : c.rates) {
    EXPECT_EQ(r.device, "cpu");
    EXPECT_NEAR(r.gflops, r.threads == 2 ? 12.0 : 7.0, 1e-9) << r.threads;
    EXPECT_EQ(r.samples, r.threads == 2 ? 5 : 12);  // steps (the first skipped) x ranks
  }
  EXPECT_NEAR(c.compute_cv, 0.1, 1e-9);
  EXPECT_NEAR(c.compute_correlation, -1.0, 1e-9);
  EXPECT_EQ(read_metrics(two).epoch_time_s, std::vector<double>{1.5});

  // Saved and read back, the calibration plans the run it came from: the same step time.
  const std::string file = testing::scratch() + "/cal.json";
  write_text(file, calibration_to_json(c));
  const PlanConstants back = read_calibration(file, base);
  ASSERT_EQ(back.rates.size(), 2u);
  EXPECT_DOUBLE_EQ(back.cpu_link_gbps, c.cpu_link_gbps);
  PlanOptions o;
  o.model = cfg;
  o.model_name = "tiny";
  o.seq_len = 128;
  o.global_batch = 24;
  o.micro_batch = 4;
  o.zero_stage = 1;
  o.train_sequences = 1800;
  o.cpu_cores = 2;
  o.slowdown = in.slowdown;
  const PlanResult p = make_plan(hf, o, back);
  EXPECT_NEAR(c.cpu_link_gbps, 0.5, 1e-9);
  // Split 4,2 with rank 1 at half speed: both ranks' mean compute is c0; the expected slowest of
  // two perfectly anti-correlated ranks with 10% variation is c0 (1 + 0.2 phi(0)).
  const double c0 = 4.0 * 4 * 128 * F / 7e9;
  EXPECT_NEAR(p.balanced.step_s, c0 * (1 + 0.2 / std::sqrt(2 * 3.14159265358979323846)) + comm_s, 1e-9);
  o.np = 1;
  o.slowdown = Slowdown();
  EXPECT_NEAR(make_plan(hf, o, back).equal.step_s, tokens * F / 12e9, 1e-12);  // no collectives on one rank
}

// Issue 35, point 6: a CPU rate is labelled with the threads the run used, as its "devices" record
// gives them (train writes each rank's OpenMP threads there), not the threads the planner's layout
// would give it; a file without them falls back to the layout and says so.
TEST(PlanCalibration, LabelsEachRunWithTheThreadsItUsed) {
  const Llama2Config cfg = preset_config("tiny");
  const double F = executed_flops_per_token(cfg, 128, Recompute::kNone);
  const int64_t tokens = 24 * 128;
  std::string steps;
  for (int i = 1; i <= 4; ++i)  // 6 GFLOP/s
    steps += strcat("{\"type\":\"step\",\"step\":", i, ",\"tokens\":", tokens, ",\"step_ms\":",
                    num(tokens * F / 6e9 * 1e3), "}\n");
  const std::string memory = strcat("{\"type\":\"memory\",\"world_size\":1,\"zero_stage\":0,\"n_params\":",
                                    cfg.num_parameters(), "}\n");
  const std::string devices = "{\"type\":\"devices\",\"device\":\"cpu\",\"ranks\":[{\"rank\":0,\"threads\":1}]}\n";
  const std::string dir = testing::scratch();
  write_text(dir + "/t1.jsonl", devices + memory + steps);
  write_text(dir + "/old.jsonl", memory + steps);
  CalibrationInput in;
  in.model = cfg;
  in.model_name = "tiny";
  in.seq_len = 128;
  in.cpu_cores = 2;  // the layout would give the one rank 2 threads
  const Hostfile hf = local_cpu_hostfile(2);
  std::vector<std::string> report;
  const PlanConstants c = fit_calibration({read_metrics(dir + "/t1.jsonl")}, hf, in, default_plan_constants(), &report);
  ASSERT_EQ(c.rates.size(), 1u);
  EXPECT_EQ(c.rates[0].threads, 1);
  EXPECT_NEAR(c.rates[0].gflops, 6.0, 1e-9);
  ASSERT_FALSE(report.empty());
  EXPECT_EQ(report[0].rfind(dir + "/t1.jsonl: rank 0 (cpu, 1 thread(s) as the run recorded): 6 GFLOP/s over 3 steps", 0), 0u)
      << report[0];
  report.clear();
  const PlanConstants old = fit_calibration({read_metrics(dir + "/old.jsonl")}, hf, in, default_plan_constants(), &report);
  EXPECT_EQ(old.rates[0].threads, 2);
  EXPECT_EQ(report[0].rfind(dir + "/old.jsonl: rank 0 (cpu, 2 thread(s) assumed (2 cores / 1 rank(s)): the run records none)", 0),
            0u)
      << report[0];
  // With OMP_NUM_THREADS=1 in the planner's environment the fallback is that count.
  in.cpu_threads = 1;
  report.clear();
  EXPECT_EQ(fit_calibration({read_metrics(dir + "/old.jsonl")}, hf, in, default_plan_constants(), &report).rates[0].threads, 1);
  // Bad or inconsistent threads are refused, naming the file, line and field.
  write_text(dir + "/bad_t.jsonl", "{\"type\":\"devices\",\"ranks\":[{\"threads\":\"two\"}]}\n" + memory + steps);
  EXPECT_NE(error_of([&] { read_metrics(dir + "/bad_t.jsonl"); })
                .find("bad_t.jsonl:1: devices record: ranks[0].threads is \"two\", expected a positive integer"),
            std::string::npos);
  write_text(dir + "/resumed.jsonl", devices + memory + steps +
                                         "{\"type\":\"devices\",\"ranks\":[{\"threads\":2}]}\n" + memory + steps);
  EXPECT_NE(error_of([&] { read_metrics(dir + "/resumed.jsonl"); })
                .find("resumed.jsonl:7: devices record: threads per rank [2] differ from the run's first start [1]"),
            std::string::npos);
  write_text(dir + "/two.jsonl", "{\"type\":\"devices\",\"ranks\":[{\"threads\":1},{\"threads\":1}]}\n" + memory + steps);
  EXPECT_NE(error_of([&] { read_metrics(dir + "/two.jsonl"); })
                .find("two.jsonl: the devices record lists the threads of 2 rank(s) but world_size is 1"),
            std::string::npos);
}

TEST(PlanErrors, NameTheFileLineAndField) {
  PlanOptions o = reference_job(128, 0);
  // An unknown GPU type: refused where the hostfile is read, with its line and the known types.
  EXPECT_NE(error_of([&] {
              parse_hostfile_text("n1 slots=4 # gpu=B300-FOO nic_gbps=100\n", "hf.txt");
            }).find("hf.txt:1:14: gpu=B300-FOO: unknown GPU type 'B300-FOO'; known types: A100-SXM4-80GB"),
            std::string::npos);
  // Two hosts, one without the network speed.
  const Hostfile no_nic = parse_hostfile_text("a slots=4 # gpu=A100-SXM4-80GB nic_gbps=100\nb slots=4 # gpu=A100-SXM4-80GB\n", "hf.txt");
  EXPECT_NE(error_of([&] { make_plan(no_nic, o, default_plan_constants()); }).find("hf.txt:2: host b has no nic_gbps="),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              PlanOptions big = o;
              big.np = 20;
              make_plan(read_hostfile(kHostfiles + "/reference-cluster"), big, default_plan_constants());
            }).find("--np 20: "),
            std::string::npos);
  // Metrics files: missing, bad JSON on a line, a missing field, a run of another model.
  const std::string dir = testing::scratch();
  EXPECT_NE(error_of([&] { read_metrics(dir + "/nope.jsonl"); }).find("nope.jsonl: cannot open"), std::string::npos);
  const std::string mem = "{\"type\":\"memory\",\"world_size\":2,\"zero_stage\":1,\"n_params\":151872}\n";
  write_text(dir + "/bad.jsonl", mem + "{\"type\":\"step\",\"step\":1,\"tokens\":3072,\"step_ms\":5}\n{\"type\":\"st");
  EXPECT_NE(error_of([&] { read_metrics(dir + "/bad.jsonl"); }).find("bad.jsonl:2: step record: no field 'split'"),
            std::string::npos);
  write_text(dir + "/bad2.jsonl", mem + "{\"type\":\"step\",\"step\":1,\"tokens\":3072,\"step_ms\":5,\"split\":[3,3],"
                                        "\"rank_compute_ms\":[1,2],\"rank_wait_ms\":[0,0]}\n{\"type\":\"st\n");
  EXPECT_NE(error_of([&] { read_metrics(dir + "/bad2.jsonl"); }).find("bad2.jsonl:3: not a JSON object"), std::string::npos);
  write_text(dir + "/bad3.jsonl", mem + "{\"type\":\"step\",\"step\":1,\"tokens\":3072,\"step_ms\":\"fast\"}\n");
  EXPECT_NE(error_of([&] { read_metrics(dir + "/bad3.jsonl"); }).find("bad3.jsonl:2: step record: field 'step_ms' is \"fast\""),
            std::string::npos);
  write_text(dir + "/nomem.jsonl", "{\"type\":\"epoch\",\"epoch_time_s\":1}\n");
  EXPECT_NE(error_of([&] { read_metrics(dir + "/nomem.jsonl"); }).find("nomem.jsonl: no {\"type\":\"memory\"} record"),
            std::string::npos);
  write_text(dir + "/other.jsonl", "{\"type\":\"memory\",\"world_size\":1,\"zero_stage\":0,\"n_params\":99}\n"
                                   "{\"type\":\"step\",\"step\":1,\"tokens\":3072,\"step_ms\":5}\n"
                                   "{\"type\":\"step\",\"step\":2,\"tokens\":3072,\"step_ms\":5}\n");
  CalibrationInput in;
  in.model = preset_config("tiny");
  in.model_name = "tiny";
  in.seq_len = 128;
  std::vector<std::string> report;
  EXPECT_NE(error_of([&] {
              fit_calibration({read_metrics(dir + "/other.jsonl")}, local_cpu_hostfile(2), in, default_plan_constants(), &report);
            }).find("other.jsonl: the run trained 99 parameters but --model-config tiny has 151872"),
            std::string::npos);
  // Calibration files: not JSON, an unknown constant, a bad rate.
  write_text(dir + "/c1.json", "{oops");
  EXPECT_NE(error_of([&] { read_calibration(dir + "/c1.json", default_plan_constants()); }).find("c1.json: not JSON"),
            std::string::npos);
  write_text(dir + "/c2.json", "{\"format\":\"llamatrain-plan-calibration\",\"format_version\":1,\"constants\":{\"gpu_eff\":0.5}}");
  EXPECT_NE(error_of([&] { read_calibration(dir + "/c2.json", default_plan_constants()); })
                .find("c2.json: constants.gpu_eff: unknown constant; expected one of gpu_efficiency"),
            std::string::npos);
  write_text(dir + "/c3.json", "{\"format\":\"llamatrain-plan-calibration\",\"format_version\":1,"
                               "\"rates\":[{\"device\":\"cpu\",\"threads\":1,\"gflops\":-3}]}");
  EXPECT_NE(error_of([&] { read_calibration(dir + "/c3.json", default_plan_constants()); })
                .find("c3.json: rates[0].gflops: expected a positive number"),
            std::string::npos);
}

TEST(PlanCli, PlansTheReferenceClusterAsJsonAndReportsErrors) {
  const std::string common = "plan --hostfile '" + kHostfiles + "/reference-cluster' --model-config llama2-7b --seq-len 512 "
                             "--zero 1 --recompute full --tokens " + std::to_string(169015LL * 512);
  const auto r = testing::run_cli(common + " --global-batch 2016 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ranks"].size(), 16u);
  EXPECT_EQ(j["steps_per_epoch"], 83);
  EXPECT_LT(j["balanced"]["epoch_s"].get<double>(), j["equal"]["epoch_s"].get<double>());
  const auto t = testing::run_cli(common + " --global-batch 2016");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("H100-PCIe-80GB"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("balanced split"), std::string::npos) << t.out;
  const auto e = testing::run_cli(common);
  EXPECT_EQ(e.status, 1);
  EXPECT_NE(e.err.find("--global-batch: required"), std::string::npos) << e.err;
  const auto m = testing::run_cli("plan --model-config tiny --seq-len 128 --calibrate '" + testing::scratch() + "/none.jsonl'");
  EXPECT_EQ(m.status, 1);
  EXPECT_NE(m.err.find("none.jsonl: cannot open"), std::string::npos) << m.err;
}

// Issue 35, point 6: plan's CPU ranks follow OMP_NUM_THREADS as train's do, and plan says the count
// and where it came from: the predicted epoch at 1 thread is twice the one at 2 (uncalibrated, one
// rank), and without OMP_NUM_THREADS a rank takes the node's cores.
TEST(PlanCli, CpuThreadsFollowOmpNumThreads) {
  const std::string job = "plan --model-config tiny --seq-len 128 --global-batch 24 --batch-size 4 --tokens 230400 "
                          "--np 1 --cpu-cores 4";
  const auto one = testing::run_cli(job + " --json", 1), two = testing::run_cli(job + " --json", 2);
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  const nlohmann::json j1 = nlohmann::json::parse(one.out), j2 = nlohmann::json::parse(two.out);
  EXPECT_EQ(j1["ranks"][0]["threads"], 1);
  EXPECT_EQ(j2["ranks"][0]["threads"], 2);
  EXPECT_EQ(j1["ranks"][0]["threads_source"], "OMP_NUM_THREADS");
  EXPECT_DOUBLE_EQ(j1["equal"]["epoch_s"].get<double>() / j2["equal"]["epoch_s"].get<double>(), 2.0);
  // 75 steps of 24 x 128 tokens at 10 GFLOP/s per thread.
  const double F = executed_flops_per_token(preset_config("tiny"), 128, Recompute::kNone);
  EXPECT_NEAR(j1["equal"]["epoch_s"].get<double>(), 75 * 24 * 128 * F / 10e9, 1e-9);
  const auto text = testing::run_cli(job, 1);
  EXPECT_NE(text.out.find("OpenMP threads per cpu rank, as train runs them: 1 on localhost (OMP_NUM_THREADS)\n"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("cpu (1 thread)"), std::string::npos) << text.out;
  const auto unset = testing::run_captured(std::string("env -u OMP_NUM_THREADS '") + LLAMATRAIN_BINARY + "' " + job);
  ASSERT_EQ(unset.status, 0) << unset.err;
  EXPECT_NE(unset.out.find("as train runs them: 4 on localhost (4 cores / 1 rank(s))\n"), std::string::npos) << unset.out;
}

// Issue 35, point 6: a job that fits no rank exits 1 (0 with --allow-unfit) and names the changes
// that fit; epochs of 3 hours or more print in hours.
TEST(PlanCli, AJobThatDoesNotFitExits1AndSaysWhatWouldFit) {
  const std::string unfit = "plan --hostfile '" + kHostfiles + "/reference-cluster' --model-config llama2-7b "
                            "--seq-len 4096 --global-batch 64 --tokens 10000000 --zero 0";
  const auto r = testing::run_cli(unfit);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("what would fit:\n  --zero 1: micro-batch 1 fits, an epoch takes "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  --zero 1 --offload-optimizer: micro-batch 1 fits"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("llamatrain plan: error: the job does not fit"), std::string::npos) << r.err;
  const auto allowed = testing::run_cli(unfit + " --allow-unfit --json");
  ASSERT_EQ(allowed.status, 0) << allowed.err;
  const nlohmann::json j = nlohmann::json::parse(allowed.out);
  EXPECT_FALSE(j["fits"].get<bool>());
  ASSERT_GE(j["would_fit"].size(), 3u) << allowed.out;
  EXPECT_EQ(j["would_fit"][0].get<std::string>().rfind("--zero 1: micro-batch 1 fits", 0), 0u) << allowed.out;
  // Nothing of the three fits Llama-2-70b at 4096 on one 80 GB card without ZeRO's peers: said so.
  const auto none = testing::run_cli("plan --hostfile '" + kHostfiles + "/reference-cluster' --np 1 --model-config "
                                     "llama2-70b --seq-len 4096 --global-batch 1 --tokens 4096");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.out.find("what would fit: nothing of --recompute, --zero and --offload-optimizer"), std::string::npos)
      << none.out;
  EXPECT_EQ(plan_duration_text(3 * 3600), "3.0 h");
  EXPECT_EQ(plan_duration_text(3 * 3600 - 60), "179.0 min");
  EXPECT_EQ(plan_duration_text(119), "119.00 s");
}

}  // namespace
}  // namespace lt
