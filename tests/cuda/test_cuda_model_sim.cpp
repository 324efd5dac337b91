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
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_decoder.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/device_comm.h"
#include "backend/cuda/device_zero.h"
#include "backend/cuda/pass_ops.h"
#include "llamatrain/comm.h"
#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/inference.h"
#include "llamatrain/model.h"
#include "llamatrain/ops_cpu.h"
#include "llamatrain/zero.h"
#include "llamatrain/plan.h"
#include "../model_compare.h"

namespace {

float bf(float v) { return __bfloat162float(__float2bfloat16(v)); }

using lt::testing::PackedBatch;  // tests/model_compare.h, shared with the CPU bf16 tests

lt::Llama2Config small_config() {
  lt::Llama2Config c = lt::preset_config("tiny");  // dim 64, 2 layers, 4 heads, 2 KV heads: head_dim 16
  return c;
}

// A model of cfg's shapes with the weights init_random(seed) gives.
lt::Llama2Model random_model(const lt::Llama2Config& cfg, uint32_t seed) {
  lt::Llama2Model m(cfg);
  m.init_random(seed);
  return m;
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

  lt::testing::expect_gradients_near(cpu.layout(), dev_grads.data(), cpu.grads().data(), 5e-2, "cuda-sim model");
}

// LoRA (issue 36) on the CUDA backend: the adapters' products, the frozen base (no weight gradient,
// and no gradient buffer for it on the device) and dropout drawing the CPU's masks. From the same
// bf16 weights and adapters (B random instead of PEFT's zeros, so that every adapter gradient is
// non-zero) with dropout 0.2 on the same stream: the loss within 1e-2 relative and each adapter's
// gradient within 5e-2 in relative L2, as the model's above (other masks would miss by far more:
// the A gradients read the dropped input itself).
TEST(CudaSimModel, LoraMatchesTheCpuBackend) {
  const uint32_t seed = 20261205;
  const uint64_t mask_stream = 77;
  std::printf("[cuda-sim lora] seed=%u, rank 4, alpha 8, dropout 0.2 (stream %llu) on all seven products\n", seed,
              static_cast<unsigned long long>(mask_stream));
  const lt::Llama2Config cfg = small_config();
  lt::Llama2Model cpu(cfg);
  cpu.init_random(seed);
  for (float& w : cpu.params()) w = bf(w);
  lt::LoraConfig lc;
  lc.rank = 4, lc.alpha = 8, lc.dropout = 0.2f;
  cpu.enable_lora(lc, seed + 1);
  std::mt19937 rng(seed + 2);
  std::normal_distribution<float> draw(0.f, 0.05f);
  for (float& w : cpu.lora_params()) w = bf(w == 0.f ? draw(rng) : w);  // B's zeros drawn; every value bf16
  cpu.set_lora_dropout_stream(mask_stream);

  lt::cuda::CudaModel dev(cfg);
  dev.set_params(cpu.params().data());
  dev.enable_lora(*cpu.lora());
  dev.set_lora_params(cpu.lora_params().data());
  dev.set_lora_dropout_stream(mask_stream);

  const PackedBatch pb(2, 48, {13, 20, 7, 30}, cfg.vocab_size, seed + 3);
  const lt::Batch batch = pb.view();
  const double cpu_loss = cpu.forward(batch), dev_loss = dev.forward(batch);
  std::printf("[cuda-sim lora] loss sum: cpu %.6f cuda-sim %.6f\n", cpu_loss, dev_loss);
  EXPECT_NEAR(dev_loss, cpu_loss, 1e-2 * std::fabs(cpu_loss));
  const float dloss = 1.0f / float(pb.loss_tokens());
  cpu.backward(batch, dloss);
  dev.backward(batch, dloss);
  EXPECT_EQ(dev.device_grads(), nullptr) << "a gradient buffer for the frozen base";
  std::vector<float> dev_grads(cpu.lora()->total());
  dev.lora_grads_to_host(dev_grads.data());
  lt::testing::expect_gradients_near(cpu.lora()->table(), dev_grads.data(), cpu.lora_grads().data(), 5e-2,
                                     "cuda-sim lora");
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
    cpu.clear_grads();
    cpu_losses.push_back(cpu.forward(batch) * dloss);
    cpu.backward(batch, dloss);
    lt::cpu::adamw_update(cpu.params().data(), m_cpu.data(), v_cpu.data(), cpu.grads().data(), P, 3e-3f, 0.9f,
                          0.95f, 1e-8f, 0.0f, step);

    dev.set_params(master.data());
    dev.clear_grads();
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

// A fresh run's Adam moments start as zeros set on the device, never as a copy of the host's
// zeros (a 7B model's are 54 GB): two host-to-device copies fewer than when the host's moments hold
// a resumed state, which reaches the device unchanged. One rank, ZeRO 0 to 3 (offloaded: nothing
// to copy either way).
TEST(CudaSimModel, FreshAdamMomentsAreSetOnTheDevice) {
  const uint32_t seed = 5;
  std::printf("[cuda-sim moments] seed=%u\n", seed);
  const lt::Llama2Config cfg = small_config();
  const lt::Llama2Model init = random_model(cfg, seed);
  auto self = lt::make_self_comm();
  for (int stage = 0; stage <= 3; ++stage) {
    uint64_t copies[2] = {0, 0};
    for (int resumed = 0; resumed <= 1; ++resumed) {
      const std::string at = "ZeRO " + std::to_string(stage) + (resumed ? ", resumed" : ", fresh");
      lt::ZeroOptimizer host(*self, init.layout(), stage, lt::AdamWConfig{});
      std::vector<float> params = init.params();
      params.resize(host.padded_size(), 0.f);
      if (stage >= 1) {  // as the trainer does on a device: the host keeps its shard of the weights
        host.hold_shard_params();
        std::copy(params.begin() + host.own_begin(), params.begin() + host.own_end(), host.shard_params().begin());
      }
      EXPECT_TRUE(std::as_const(host).adamw().moments_zero()) << at << ": a new optimizer's moments";
      const auto value = [](size_t i, float base) { return base + 1e-6f * float(i % 1000); };
      if (resumed) {
        std::vector<float>& m = host.adamw().m();
        std::vector<float>& v = host.adamw().v();
        for (size_t i = 0; i < m.size(); ++i) m[i] = value(i, 0.25f), v[i] = value(i, 0.5f);
        EXPECT_FALSE(std::as_const(host).adamw().moments_zero()) << at << ": after write access";
      }
      lt::cuda::CudaModel dev(cfg);
      const uint64_t before = lt::cuda::device_counters().h2d_copies;
      dev.init_optimizer(host, params.data());
      copies[resumed] = lt::cuda::device_counters().h2d_copies - before;
      // Back to the host over values that are neither: the device's moments as they started.
      std::fill(host.adamw().m().begin(), host.adamw().m().end(), -1.f);
      std::fill(host.adamw().v().begin(), host.adamw().v().end(), -1.f);
      dev.optimizer_state_to_host(host, params.data());
      const std::vector<float>& m = host.adamw().m();
      const std::vector<float>& v = host.adamw().v();
      size_t bad = m.size();
      for (size_t i = 0; i < m.size() && bad == m.size(); ++i)
        if (m[i] != (resumed ? value(i, 0.25f) : 0.f) || v[i] != (resumed ? value(i, 0.5f) : 0.f)) bad = i;
      EXPECT_EQ(bad, m.size()) << at << ": moment " << bad << " came back as m " << m[bad] << ", v " << v[bad];
    }
    std::printf("[cuda-sim moments] ZeRO %d: %llu host-to-device copies fresh, %llu resumed\n", stage,
                static_cast<unsigned long long>(copies[0]), static_cast<unsigned long long>(copies[1]));
    EXPECT_EQ(copies[0] + 2, copies[1]) << "ZeRO " << stage << ": the fresh moments were copied from the host";
  }
}

// Rank 0 of a 2-rank world whose host collectives do nothing: the tests below look at what the
// device optimizer asks of its device communicator (the sums themselves are tested under mpirun,
// CudaSimTraining.* and CheckpointMpi.CudaSim*).
class TwoRankView final : public lt::Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "two-rank view"; }
  void allreduce_sum(void*, size_t, lt::DType) override {}
  void reduce_scatter_sum(void*, size_t, lt::DType) override {}
  void reduce_sum(void*, size_t, lt::DType, int) override {}
  void allgather(void*, size_t, lt::DType) override {}
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
};

// Records every device collective: kind, flat offset, count, root, and whether the embedding's
// gradient (written last by backward) was still all zero at that moment: what the collective would
// see, once the work its stream waits for has run (the simulator's streams queue work until then).
struct DeviceCall {
  std::string kind;
  size_t begin = 0, count = 0;
  int root = -1;
  bool embedding_done = false;
};
class RecordingDeviceComm final : public lt::cuda::DeviceComm {
 public:
  RecordingDeviceComm(std::vector<DeviceCall>* calls, const float** grads, const __nv_bfloat16** params,
                      const cudaStream_t* stream, size_t embedding_numel)
      : calls_(calls), grads_(grads), params_(params), stream_(stream), embedding_numel_(embedding_numel) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "recording"; }
  void allreduce_sum(float* buf, size_t count) override { record("allreduce", buf, count, -1); }
  void reduce_sum(float* buf, size_t count, int root) override { record("reduce", buf, count, root); }
  void allreduce_sum(__nv_bfloat16*, size_t count) override { calls_->push_back({"allreduce_bf16", 0, count}); }
  void reduce_sum(__nv_bfloat16*, size_t count, int root) override {
    calls_->push_back({"reduce_bf16", 0, count, root});
  }
  void allgather(__nv_bfloat16*, size_t shard_count) override { calls_->push_back({"allgather", 0, shard_count}); }
  void allgather_v(__nv_bfloat16* buf, const std::vector<size_t>& counts) override {
    size_t n = 0;
    for (size_t c : counts) n += c;
    calls_->push_back({"allgather_v", size_t(buf - *params_), n});
  }
  void group_begin() override { calls_->push_back({"group_begin"}); }
  void group_end() override { calls_->push_back({"group_end"}); }
  void synchronize() override { lt::cuda::stream_synchronize(*stream_); }

 private:
  // Without a whole gradient buffer (ZeRO 2: block scratch) only the kind, count and root.
  void record(const char* kind, const float* buf, size_t count, int root) {
    DeviceCall c{kind, *grads_ ? size_t(buf - *grads_) : 0, count, root};
    lt::cuda::stream_synchronize(*stream_);
    for (size_t i = 0; *grads_ && i < embedding_numel_ && !c.embedding_done; ++i) c.embedding_done = (*grads_)[i] != 0.f;
    calls_->push_back(c);
  }
  std::vector<DeviceCall>* calls_;
  const float** grads_;
  const __nv_bfloat16** params_;
  const cudaStream_t* stream_;
  size_t embedding_numel_;
};

// Rank 0 of a 2-rank ZeRO run of small_config() on the device whose device collectives are
// recorded (RecordingDeviceComm): the weights from init_random(seed), --bucket-mb as bucket_bytes.
struct RecordedZeroRun {
  lt::Llama2Config cfg = small_config();
  lt::Llama2Model init;
  TwoRankView view;
  lt::ZeroOptimizer host;
  lt::cuda::CudaModel dev{cfg};
  std::vector<DeviceCall> calls;
  const float* grads = nullptr;
  const __nv_bfloat16* weights = nullptr;
  cudaStream_t comm_stream = nullptr;
  RecordedZeroRun(uint32_t seed, int stage, size_t bucket_bytes)
      : init(random_model(cfg, seed)), host(view, init.layout(), stage, lt::AdamWConfig{}) {
    std::vector<float> params = init.params();
    params.resize(host.padded_size(), 0.f);
    dev.set_collectives({lt::kDefaultCommTimeoutS, bucket_bytes});
    const size_t emb = size_t(cfg.vocab_size) * cfg.dim;
    dev.init_optimizer(host, params.data(),
                  std::make_unique<RecordingDeviceComm>(&calls, &grads, &weights, &comm_stream, emb));
    grads = dev.device_grads();
    weights = dev.device_params();
    comm_stream = dev.device_comm_stream();
  }
};

// ZeRO 0 and 1: the gradient reduction is issued in buckets while backward runs: the output head's
// bucket first, before the embedding's gradient exists, the embedding's last; together they cover
// the padded vector once, and each bucket is the blocks gradient_buckets gives for the size (0:
// one per block; the size of a layer and the head: two buckets of two blocks each). ZeRO 0
// all-reduces a bucket; ZeRO 1 reduces each piece of it to the rank that owns it (one group per
// bucket) and the update all-gathers the working copy block by block, in forward order, covering
// the weights once. (ZeRO 2 reduces block by block every micro-batch: the next test.)
TEST(CudaSimModel, ZeroReducesGradientBucketsDuringBackward) {
  const uint32_t seed = 11;
  std::printf("[cuda-sim zero] seed=%u\n", seed);
  const PackedBatch pb(2, 32, {20, 12}, small_config().vocab_size, seed + 1);
  const lt::ParameterLayout layout(small_config());
  const size_t two_blocks = 4 * (layout.blocks[1].size() + layout.blocks.back().size());
  for (size_t bucket_bytes : {size_t(0), two_blocks})
  for (int stage : {0, 1}) {
    RecordedZeroRun run(seed, stage, bucket_bytes);
    lt::ZeroOptimizer& host = run.host;
    lt::cuda::CudaModel& dev = run.dev;
    const std::vector<DeviceCall>& calls = run.calls;
    const lt::GradientBuckets expect = lt::gradient_buckets(layout, host.padded_size(), bucket_bytes);
    dev.clear_grads();
    const lt::Batch batch = pb.view();
    dev.forward(batch);
    dev.backward_last(batch, 1.0f / float(pb.loss_tokens()));
    const double norm = dev.reduce_and_clip_grads(1.0f);
    EXPECT_GT(norm, 0.0);
    dev.optimizer_step(1e-3f, 1);

    // Each bucket's flat range, in issue order: an all-reduce (ZeRO 0) or a group of reduces (ZeRO 1).
    std::vector<DeviceCall> sums, gathers;
    std::vector<std::pair<size_t, size_t>> issued;
    int groups = 0;
    for (const DeviceCall& c : calls) {
      if (c.kind == "group_begin") ++groups;
      if (c.kind == "allgather_v") gathers.push_back(c);
      EXPECT_NE(c.kind, "allgather") << "the working copy is gathered block by block";
      if (c.kind != "reduce" && c.kind != "allreduce") continue;
      const bool new_bucket = stage == 0 || int(issued.size()) < groups;
      if (new_bucket) issued.push_back({c.begin, c.begin + c.count});
      issued.back().first = std::min(issued.back().first, c.begin);
      issued.back().second = std::max(issued.back().second, c.begin + c.count);
      sums.push_back(c);
    }
    std::printf("[cuda-sim zero] ZeRO %d, buckets of %zu bytes: %zu buckets, %zu reductions in %d groups, %zu "
                "all-gathers; first at offset %zu, embedding done at first %d, at last %d\n",
                stage, bucket_bytes, expect.size(), sums.size(), groups, gathers.size(),
                sums.empty() ? 0 : sums.front().begin, sums.empty() ? -1 : int(sums.front().embedding_done),
                sums.empty() ? -1 : int(sums.back().embedding_done));
    ASSERT_FALSE(sums.empty());
    EXPECT_FALSE(sums.front().embedding_done) << "the first bucket waited for the whole backward";
    EXPECT_TRUE(sums.back().embedding_done) << "the embedding's bucket was reduced before its gradient was written";
    // From the top down: the output head's bucket first, the embedding's last.
    ASSERT_EQ(issued.size(), expect.size());
    for (size_t i = 0; i < issued.size(); ++i) {
      const size_t k = expect.size() - 1 - i;
      EXPECT_EQ(issued[i].first, expect.bounds[k]) << "bucket " << k;
      EXPECT_EQ(issued[i].second, expect.bounds[k + 1]) << "bucket " << k;
    }
    const size_t S = host.shards().shard;
    std::vector<int> covered(host.padded_size(), 0);
    for (const DeviceCall& c : sums) {
      for (size_t i = c.begin; i < c.begin + c.count; ++i) ++covered[i];
      if (stage == 1) {
        EXPECT_EQ(c.kind, "reduce");
        EXPECT_EQ(int(c.begin / S), c.root) << "piece at " << c.begin;
        EXPECT_EQ(int((c.begin + c.count - 1) / S), c.root) << "piece at " << c.begin << " crosses a shard";
      } else {
        EXPECT_EQ(c.kind, "allreduce");
      }
    }
    EXPECT_EQ(size_t(std::count(covered.begin(), covered.end(), 1)), covered.size()) << "not covered exactly once";
    EXPECT_EQ(groups, stage == 1 ? int(expect.size()) : 0);
    // ZeRO 1: the working copy is gathered block by block; ZeRO 0 has nothing to gather.
    ASSERT_EQ(gathers.size(), stage == 1 ? layout.blocks.size() : 0u);
    for (size_t b = 0; b < gathers.size(); ++b) {
      EXPECT_EQ(gathers[b].begin, layout.blocks[b].begin) << "block " << b;
      EXPECT_EQ(gathers[b].count, layout.blocks[b].size()) << "block " << b;
    }
  }
}

// True ZeRO 2: no whole gradient buffer. Each micro-batch's backward reduces every block as soon
// as it is done, from the output head down to the embedding, each owner's piece of the block to
// its owner (one group per block; the pieces are the shards' cut of the block); the update still
// all-gathers the working copy block by block. Two micro-batches give the sequence twice.
TEST(CudaSimModel, Zero2ReducesEachBlockEveryMicroBatch) {
  const uint32_t seed = 12;
  std::printf("[cuda-sim zero 2] seed=%u\n", seed);
  const PackedBatch pb(2, 32, {20, 12}, small_config().vocab_size, seed + 1);
  RecordedZeroRun run(seed, 2, lt::kDefaultBucketMiB << 20);
  const lt::ParameterLayout& layout = run.init.layout();
  lt::ZeroOptimizer& host = run.host;
  lt::cuda::CudaModel& dev = run.dev;
  const std::vector<DeviceCall>& calls = run.calls;
  EXPECT_EQ(dev.device_grads(), nullptr) << "ZeRO 2 allocated a whole gradient buffer";
  dev.clear_grads();
  const lt::Batch batch = pb.view();
  const float dloss = 1.0f / float(pb.loss_tokens());
  dev.forward(batch);
  dev.backward(batch, dloss);
  dev.forward(batch);
  dev.backward_last(batch, dloss);
  EXPECT_GT(dev.reduce_and_clip_grads(1.0f), 0.0);
  dev.optimizer_step(1e-3f, 1);

  // Each group's reduces: (count, root) in issue order.
  std::vector<std::vector<std::pair<size_t, int>>> groups;
  std::vector<DeviceCall> gathers;
  bool open = false;
  for (const DeviceCall& c : calls) {
    EXPECT_NE(c.kind, "allreduce") << "ZeRO 2 all-reduced gradients";
    if (c.kind == "group_begin") groups.emplace_back(), open = true;
    if (c.kind == "group_end") open = false;
    if (c.kind == "allgather_v") gathers.push_back(c);
    if (c.kind != "reduce") continue;
    EXPECT_TRUE(open) << "a reduce outside a group";
    if (open) groups.back().push_back({c.count, c.root});
  }
  const int nb = int(layout.blocks.size());
  std::printf("[cuda-sim zero 2] %zu groups of reduces for %d blocks x 2 micro-batches, %zu all-gathers\n",
              groups.size(), nb, gathers.size());
  ASSERT_EQ(groups.size(), size_t(2 * nb));
  for (int mb = 0; mb < 2; ++mb)
    for (int i = 0; i < nb; ++i) {
      // The head's block first, the embedding's last.
      const int b = i == 0 ? layout.head_block() : i == nb - 1 ? 0 : layout.head_block() - i;
      const lt::ParameterLayout::Block& blk = layout.blocks[size_t(b)];
      std::vector<std::pair<size_t, int>> expect;
      const std::vector<size_t> pieces = host.shards().pieces(blk.begin, blk.end);
      for (int r = 0; r < 2; ++r)
        if (pieces[size_t(r)] > 0) expect.push_back({pieces[size_t(r)], r});
      EXPECT_EQ(groups[size_t(mb * nb + i)], expect) << "micro-batch " << mb << ", block " << b;
    }
  ASSERT_EQ(gathers.size(), layout.blocks.size());
  for (size_t b = 0; b < gathers.size(); ++b) {
    EXPECT_EQ(gathers[b].begin, layout.blocks[b].begin) << "block " << b;
    EXPECT_EQ(gathers[b].count, layout.blocks[b].size()) << "block " << b;
  }
}

// gradient_buckets: whole blocks from the top down until a bucket holds the size; the padding in
// the top bucket; 0 gives one bucket per block; a size past the model gives one bucket.
TEST(CudaSimModel, GradientBucketsGroupWholeBlocksFromTheTop) {
  const lt::Llama2Config cfg = small_config();
  const lt::ParameterLayout layout(cfg);
  const size_t padded = layout.total() + 6, nb = layout.blocks.size();
  const auto per_block = lt::gradient_buckets(layout, padded, 0);
  ASSERT_EQ(per_block.size(), nb);
  for (size_t b = 0; b < nb; ++b) {
    EXPECT_EQ(per_block.bounds[b], layout.blocks[b].begin);
    EXPECT_EQ(per_block.first_block[b], int(b));
  }
  EXPECT_EQ(per_block.bounds.back(), padded);
  const auto one = lt::gradient_buckets(layout, padded, padded * 4 + 1);
  EXPECT_EQ(one.bounds, (std::vector<size_t>{0, padded}));
  EXPECT_EQ(one.first_block, (std::vector<int>{0}));
  // Buckets of the head's and a layer's bytes close after the head and the top layer, then hold
  // the other layer and the embedding.
  const size_t layer = layout.blocks[1].size(), head = padded - layout.blocks.back().begin;
  std::printf("[buckets] tiny: embedding %zu, layer %zu, head with padding %zu floats\n", layout.blocks[0].size(),
              layer, head);
  const size_t bytes = 4 * (head + layer);
  const auto two = lt::gradient_buckets(layout, padded, bytes);
  ASSERT_EQ(cfg.n_layers, 2);
  EXPECT_EQ(two.bounds, (std::vector<size_t>{0, layout.blocks[2].begin, padded}));
  EXPECT_EQ(two.first_block, (std::vector<int>{0, 2}));
}

// Activation recomputation (src/model/llama2_pass.h) on the CUDA backend: none, attn and full give
// the same loss and gradient bits over two micro-batches accumulated into the gradients (3 layers,
// GQA, packed rows, a loss mask), and each mode's activation_bytes is the planner's figure for
// bf16 activations and fp32 statistics (plan_activation_bytes with 2-byte elements).
TEST(CudaSimModel, RecomputeModesGiveBitIdenticalGradients) {
  const uint32_t seed = 20261130;
  std::printf("[cuda-sim recompute] seed=%u\n", seed);
  lt::Llama2Config cfg = small_config();
  cfg.n_layers = 3;
  lt::Llama2Model host(cfg);
  host.init_random(seed);
  const PackedBatch b1(2, 40, {13, 20, 7, 30}, cfg.vocab_size, seed + 1);
  const PackedBatch b2(2, 40, {9, 31}, cfg.vocab_size, seed + 2);
  const size_t P = host.layout().total();

  struct Run {
    double loss1 = 0, loss2 = 0;
    std::vector<float> tok1, grads;
  };
  auto run = [&](lt::Recompute r) {
    lt::cuda::CudaModel dev(cfg);
    dev.set_recompute(r);
    dev.set_params(host.params().data());
    Run out;
    out.tok1.resize(size_t(b1.B) * b1.T);
    out.grads.resize(P);
    out.loss1 = dev.forward(b1.view(), out.tok1.data());
    dev.backward(b1.view(), 1.0f / float(b1.loss_tokens()));
    out.loss2 = dev.forward(b2.view());
    dev.backward(b2.view(), 1.0f / float(b2.loss_tokens()));
    dev.grads_to_host(out.grads.data());
    return out;
  };
  const Run none = run(lt::Recompute::kNone);
  double norm = 0;
  for (float g : none.grads) norm += double(g) * g;
  std::printf("[cuda-sim recompute] none: loss %.9g + %.9g, |grad| %.6g\n", none.loss1, none.loss2, std::sqrt(norm));
  ASSERT_GT(norm, 0.0);
  for (lt::Recompute r : {lt::Recompute::kAttn, lt::Recompute::kFull}) {
    const Run got = run(r);
    const std::string name = lt::recompute_name(r);
    std::printf("[cuda-sim recompute] %s: loss %.9g + %.9g\n", name.c_str(), got.loss1, got.loss2);
    EXPECT_EQ(std::memcmp(&got.loss1, &none.loss1, sizeof(double)), 0) << name << " " << got.loss1 << " vs " << none.loss1;
    EXPECT_EQ(std::memcmp(&got.loss2, &none.loss2, sizeof(double)), 0) << name << " " << got.loss2 << " vs " << none.loss2;
    EXPECT_EQ(std::memcmp(got.tok1.data(), none.tok1.data(), got.tok1.size() * sizeof(float)), 0)
        << name << ": per-token losses differ";
    size_t differ = 0, worst = 0;
    double worst_e = -1;
    for (size_t i = 0; i < P; ++i) {
      if (std::memcmp(&got.grads[i], &none.grads[i], sizeof(float)) == 0) continue;
      ++differ;
      const double e = std::fabs(double(got.grads[i]) - double(none.grads[i]));
      if (!(e <= worst_e)) worst_e = e, worst = i;
    }
    std::string where;
    for (const auto& t : host.layout().tensors())
      if (worst >= t.offset && worst < t.offset + t.numel) where = lt::strcat(t.name, "[", worst - t.offset, "]");
    EXPECT_EQ(differ, 0u) << name << ": gradients differ in " << differ << " of " << P << " elements; worst "
                          << where << ": " << got.grads[worst] << " vs " << none.grads[worst];
  }

  lt::cuda::CudaModel dev(cfg);
  size_t last = 0;
  for (lt::Recompute r : {lt::Recompute::kNone, lt::Recompute::kAttn, lt::Recompute::kFull}) {
    dev.set_recompute(r);
    const size_t bytes = dev.activation_bytes(4, 256);
    std::printf("[cuda-sim recompute] activation bytes at B=4 T=256, %s: %zu\n", lt::recompute_name(r), bytes);
    EXPECT_DOUBLE_EQ(double(bytes), lt::plan_activation_bytes(cfg, 4, 256, r, 2)) << lt::recompute_name(r);
    if (last) {
      EXPECT_LT(bytes, last) << lt::recompute_name(r);
    }
    last = bytes;
  }
}

// Decoding with a KV cache on the CUDA backend (generate --device cuda-sim): the tiny model (GQA:
// 4 heads on 2 KV heads) from bf16-rounded weights, fed the CPU decoder's greedy tokens for the
// whole context of 128 positions. At every position the logits (fp32, from bf16 activations and
// cache) are within 2e-2 of the CPU's largest logit magnitude, and the greedy token is the CPU's
// wherever the CPU's top two logits are further apart than that (a closer pair may swap in bf16).
// The same positions fed again from position 0 give the same logits bit for bit (the cache is
// overwritten in place, as generate's next prompt does).
TEST(CudaSimDecoder, LogitsAndGreedyTokensFollowTheCpu) {
  const uint32_t seed = 20261205;
  std::printf("[cuda-sim decoder] seed=%u, tiny with bf16 weights, 128 positions\n", seed);
  lt::Llama2Model model = random_model(small_config(), seed);
  for (float& w : model.params()) w = bf(w);
  const int len = model.config().max_seq_len, V = model.config().vocab_size;
  lt::CpuDecoder cpu(model, len);
  lt::cuda::CudaDecoder dev(model, len);
  int32_t token = 1;
  double worst = 0;
  int compared = 0, worst_pos = 0;
  std::vector<float> first_logits;
  for (int pos = 0; pos < len; ++pos) {
    const std::vector<float> ref = cpu.step(token, pos);
    const std::vector<float>& got = dev.step(token, pos);
    if (pos == 0) first_logits = got;
    double top = 0, err = 0;
    for (int i = 0; i < V; ++i) top = std::max(top, double(std::fabs(ref[size_t(i)])));
    for (int i = 0; i < V; ++i) err = std::max(err, double(std::fabs(got[size_t(i)] - ref[size_t(i)])));
    if (err / top > worst) worst = err / top, worst_pos = pos;
    std::vector<float> sorted = ref;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const int32_t next = int32_t(std::max_element(ref.begin(), ref.end()) - ref.begin());
    if (sorted[0] - sorted[1] > 2e-2 * top) {
      ++compared;
      EXPECT_EQ(int32_t(std::max_element(got.begin(), got.end()) - got.begin()), next) << "position " << pos;
    }
    token = next;
  }
  std::printf("[cuda-sim decoder] worst logit error %.3e of the largest logit (position %d); greedy tokens "
              "compared at %d of %d positions\n", worst, worst_pos, compared, len);
  EXPECT_LT(worst, 2e-2);
  EXPECT_GT(compared, len / 2);
  const std::vector<float>& again = dev.step(1, 0);
  EXPECT_EQ(std::memcmp(again.data(), first_logits.data(), first_logits.size() * sizeof(float)), 0);
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
    model.set_attention(lt::Attention::kCudnn);
    ADD_FAILURE() << "set_attention(kCudnn) must throw in the simulator build";
  } catch (const lt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--attention cudnn runs only on a GPU"), std::string::npos) << what;
    EXPECT_NE(what.find("--attention native"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(model.set_attention(lt::Attention::kNative));
}

}  // namespace
