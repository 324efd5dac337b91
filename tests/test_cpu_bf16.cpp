// The CPU backend's bf16 path (--precision bf16): the oneDNN matmul wrapper against an fp64
// reference for every transpose combination, and the bf16 model pass against the fp32 reference
// (the same batches, tolerances and gradient metric as the cuda-sim model tests: the loss within
// 1e-2 relative, every gradient tensor within 5e-2 in relative L2 norm; STYLE.md's bf16 ~1e-2).
// Skipped (with the reason) where oneDNN cannot be loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/onednn/bf16.h"
#include "backend/cpu/onednn/matmul_onednn.h"
#include "llamatrain/config.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/lora.h"
#include "llamatrain/model.h"
#include "llamatrain/ops_cpu.h"
#include "model_compare.h"
#include "test_util.h"

namespace {

using lt::cpu::bf16;
using lt::cpu::bf16_to_float;
using lt::cpu::float_to_bf16;

bool onednn_or_skip() {
  try {
    (void)lt::cpu::onednn::has_amx();
    return true;
  } catch (const lt::Error& e) {
    std::printf("oneDNN unavailable: %s\n", e.what());
    return false;
  }
}
// oneDNN loads and has bf16 matrix products on this CPU (AVX-512 or better; an AVX2 CPU has none,
// and train refuses --precision bf16 there: CpuBf16Cli.WarnsWithoutAmxAndRefusesWithoutAvx512).
#define BF16_PRODUCTS_OR_SKIP()                                                                   \
  if (!onednn_or_skip()) GTEST_SKIP() << "oneDNN cannot be loaded";                               \
  if (!lt::cpu::onednn::has_bf16_matmul())                                                        \
  GTEST_SKIP() << "oneDNN has no bf16 products on this CPU: ISA " << lt::cpu::onednn::effective_isa()

// Row-major storage of an (rows, cols) matrix with leading dimension ld >= cols, bf16 values.
std::vector<bf16> random_bf16(int rows, int ld, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<bf16> m(size_t(rows) * ld);
  for (auto& v : m) v = float_to_bf16(nd(rng));
  return m;
}

// C = op(A) op(B) (+ C0) for every (trans_a, trans_b, accumulate), odd shapes and padded leading
// dimensions, against fp64 on the same bf16 values. The products accumulate in fp32: each element
// within K * 2^-24 * sum_k |a_ik b_kj| (+ one fp32 rounding of C0's sum) of the exact value, the
// classic bound for a K-term fp32 sum; a naive fp32 loop's worst error is printed next to it.
TEST(OnednnMatmul, EveryTransposeMatchesFp64) {
  BF16_PRODUCTS_OR_SKIP();
  const uint32_t seed = 20261201;
  std::printf("seed=%u, oneDNN ISA %s\n", seed, lt::cpu::onednn::effective_isa().c_str());
  std::mt19937 rng(seed);
  struct Shape { int M, N, K; };
  for (const Shape s : {Shape{37, 53, 71}, Shape{64, 96, 300}, Shape{1, 17, 5}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc) {
          const int M = s.M, N = s.N, K = s.K;
          const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
          const int lda = a_cols + 3, ldb = b_cols + 5, ldc = N + 2;
          const auto A = random_bf16(a_rows, lda, rng), B = random_bf16(b_rows, ldb, rng);
          std::vector<float> C(size_t(M) * ldc), C0(C.size());
          std::normal_distribution<float> nd(0.f, 1.f);
          for (auto& v : C0) v = nd(rng);
          C = C0;
          lt::cpu::onednn::gemm_bf16(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, acc, C.data(), ldc);
          double worst = 0, worst_naive = 0, worst_ratio = 0;
          int wi = 0, wj = 0;
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
              double exact = acc ? C0[size_t(i) * ldc + j] : 0.0, mag = 0;
              float naive = 0.f;
              for (int k = 0; k < K; ++k) {
                const float a = bf16_to_float(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]);
                const float b = bf16_to_float(tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]);
                exact += double(a) * b, mag += std::fabs(double(a) * b), naive += a * b;
              }
              if (acc) naive += C0[size_t(i) * ldc + j];
              const double err = std::fabs(C[size_t(i) * ldc + j] - exact);
              const double bound = K * std::ldexp(1.0, -24) * mag + std::ldexp(1.0, -24) * std::fabs(exact) + 1e-30;
              worst_naive = std::max(worst_naive, std::fabs(naive - exact));
              if (err / bound > worst_ratio) worst_ratio = err / bound, worst = err, wi = i, wj = j;
              ASSERT_TRUE(std::isfinite(C[size_t(i) * ldc + j]));
            }
          std::printf("M,N,K=%d,%d,%d trans %d%d acc %d: worst |err| %.3e at (%d,%d) = %.3f of the bound; naive "
                      "fp32 worst %.3e; %s\n",
                      M, N, K, ta, tb, acc, worst, wi, wj, worst_ratio, worst_naive,
                      lt::cpu::onednn::gemm_bf16_last_impl().c_str());
          EXPECT_LE(worst_ratio, 1.0) << "M,N,K=" << M << "," << N << "," << K << " trans " << ta << tb << " acc " << acc;
          // Padding columns of C (j >= N) are untouched.
          for (int i = 0; i < M; ++i)
            for (int j = N; j < ldc; ++j) ASSERT_EQ(C[size_t(i) * ldc + j], C0[size_t(i) * ldc + j]);
        }
}

// A packed B (gemm_bf16_pack: fp32 -> bf16 in the kernel's layout, one pass) gives the product of
// the bf16-rounded B (float_to_bf16, round to nearest even) within the same fp32 bound as above,
// for B = w^T and B = w, with fp32 and bf16 output (bf16: within one bf16 rounding of that).
TEST(OnednnMatmul, PackedBMatchesFp64OfRoundedB) {
  BF16_PRODUCTS_OR_SKIP();
  const uint32_t seed = 20261202;
  std::printf("seed=%u\n", seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape { int M, N, K; };
  for (const Shape s : {Shape{37, 53, 71}, Shape{64, 96, 300}, Shape{256, 64, 96}})
    for (int tb = 0; tb < 2; ++tb)
      for (int out_bf16 = 0; out_bf16 < 2; ++out_bf16) {
        const int M = s.M, N = s.N, K = s.K, ldb = tb ? K : N;
        const auto A = random_bf16(M, K, rng);
        std::vector<float> B(size_t(tb ? N : K) * ldb);
        for (auto& v : B) v = nd(rng);
        std::vector<bf16> Bp(lt::cpu::onednn::gemm_bf16_packed_bytes(M, N, K, out_bf16) / sizeof(bf16) + 1);
        lt::cpu::onednn::gemm_bf16_pack(Bp.data(), tb, M, N, K, B.data(), ldb, out_bf16);
        std::vector<float> C(size_t(M) * N, -7.f);
        std::vector<bf16> Cb(C.size());
        if (out_bf16)
          lt::cpu::onednn::gemm_bf16_packed_out_bf16(M, N, K, A.data(), Bp.data(), Cb.data());
        else
          lt::cpu::onednn::gemm_bf16_packed(M, N, K, A.data(), Bp.data(), C.data());
        double worst_ratio = 0;
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            double exact = 0, mag = 0;
            for (int k = 0; k < K; ++k) {
              const double a = bf16_to_float(A[size_t(i) * K + k]);
              const double b = bf16_to_float(float_to_bf16(tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]));
              exact += a * b, mag += std::fabs(a * b);
            }
            const double got = out_bf16 ? bf16_to_float(Cb[size_t(i) * N + j]) : C[size_t(i) * N + j];
            const double bound = K * std::ldexp(1.0, -24) * mag + std::ldexp(1.0, out_bf16 ? -8 : -24) * std::fabs(exact) + 1e-30;
            ASSERT_TRUE(std::isfinite(got));
            worst_ratio = std::max(worst_ratio, std::fabs(got - exact) / bound);
          }
        std::printf("M,N,K=%d,%d,%d B=%s out %s: worst error %.3f of the bound; %s\n", M, N, K, tb ? "w^T" : "w",
                    out_bf16 ? "bf16" : "fp32", worst_ratio, lt::cpu::onednn::gemm_bf16_last_impl().c_str());
        EXPECT_LE(worst_ratio, 1.0) << "M,N,K=" << M << "," << N << "," << K << " trans_b " << tb;
      }
}

TEST(OnednnMatmul, PrimitivesAreCreatedOncePerShape) {
  BF16_PRODUCTS_OR_SKIP();
  std::vector<bf16> a(32 * 16, float_to_bf16(1.f)), b(16 * 8, float_to_bf16(0.5f));
  std::vector<float> c(32 * 8);
  const size_t before = lt::cpu::onednn::gemm_bf16_cached_primitives();
  for (int rep = 0; rep < 3; ++rep)
    lt::cpu::onednn::gemm_bf16(false, false, 32, 8, 16, a.data(), 16, b.data(), 8, false, c.data(), 8);
  EXPECT_EQ(lt::cpu::onednn::gemm_bf16_cached_primitives(), before + 1);
  EXPECT_EQ(c[0], 8.f);
  lt::cpu::onednn::gemm_bf16(false, false, 32, 8, 16, a.data(), 16, b.data(), 8, true, c.data(), 8);
  EXPECT_EQ(lt::cpu::onednn::gemm_bf16_cached_primitives(), before + 2) << "accumulate is its own primitive";
  EXPECT_EQ(c[0], 16.f);
}

lt::Llama2Config tiny() { return lt::preset_config("tiny"); }  // dim 64, 2 layers, 4 heads, 2 KV heads

// An fp32 model with random weights from seed and a bf16 twin holding the same fp32 weights, both
// with gradient buffers: the reference and the model under test.
struct Fp32AndBf16 {
  lt::Llama2Model ref, bf16;
  Fp32AndBf16(const lt::Llama2Config& cfg, uint32_t seed) : ref(cfg), bf16(cfg) {
    ref.init_random(seed);
    bf16.params() = ref.params();
    ref.allocate_grads();
    bf16.allocate_grads();
    bf16.set_precision(lt::Precision::kBf16);
  }
};

// One forward + backward of the bf16 pass against the fp32 pass on the same fp32 weights, in each
// recompute mode; the bf16 gradients are also the same bits in every mode (the recomputation writes
// the same bf16 copies).
TEST(CpuBf16Model, LossAndGradientsFollowFp32InEveryRecomputeMode) {
  BF16_PRODUCTS_OR_SKIP();
  const uint32_t seed = 20261129;
  std::printf("seed=%u\n", seed);
  const lt::Llama2Config cfg = tiny();
  Fp32AndBf16 pair(cfg, seed);
  lt::Llama2Model &ref = pair.ref, &m = pair.bf16;
  const lt::testing::PackedBatch pb(2, 48, {13, 20, 7, 30}, cfg.vocab_size, seed + 1);
  const lt::Batch batch = pb.view();
  const int n = pb.B * pb.T;
  const float dloss = 1.0f / float(pb.loss_tokens());
  std::vector<float> ref_tok(n), tok(n);
  const double ref_loss = ref.forward(batch, ref_tok.data());
  ref.backward(batch, dloss);
  std::vector<float> first;
  for (const lt::Recompute r : {lt::Recompute::kNone, lt::Recompute::kAttn, lt::Recompute::kFull}) {
    m.set_recompute(r);
    m.clear_grads();
    const double loss = m.forward(batch, tok.data());
    std::printf("[bf16 %s] loss sum fp32 %.6f bf16 %.6f (%d loss tokens)\n", lt::recompute_name(r), ref_loss, loss,
                pb.loss_tokens());
    EXPECT_NEAR(loss, ref_loss, 1e-2 * std::fabs(ref_loss));
    double worst = 0;
    int wi = 0;
    for (int i = 0; i < n; ++i) {
      if (!pb.mask[size_t(i)]) {
        EXPECT_EQ(tok[size_t(i)], 0.f);
        continue;
      }
      const double e = std::fabs(tok[size_t(i)] - ref_tok[size_t(i)]);
      if (e > worst) worst = e, wi = i;
    }
    std::printf("[bf16 %s] per-token loss worst |err| %.3e at %d (fp32 %.5f)\n", lt::recompute_name(r), worst, wi,
                ref_tok[size_t(wi)]);
    EXPECT_LT(worst, 5e-2 * std::max(1.0, double(ref_tok[size_t(wi)])));
    m.backward(batch, dloss);
    const std::string tag = std::string("bf16 ") + lt::recompute_name(r);
    lt::testing::expect_gradients_near(m.layout(), m.grads().data(), ref.grads().data(), 5e-2, tag.c_str());
    if (first.empty()) first = m.grads();
    else EXPECT_EQ(m.grads(), first) << lt::recompute_name(r) << ": not the same bits as recompute none";
  }
}

// LoRA on a bf16 base (issue 36: the frozen base in bf16 on the CPU): the base's products read bf16
// copies, the adapters' stay fp32 (fp32 masters), against the fp32 pass with the same weights and
// adapters (every adapter's B drawn non-zero so that every A has a gradient; dropout 0.2 under one
// mask stream): the loss within 1e-2 and every adapter gradient within 5e-2 relative L2 (the
// tolerances of the model's gradients above), in every recompute mode; the base's weights the same
// bits after the passes, and no gradient buffer for it.
TEST(CpuBf16Model, LoraAdaptersOnABf16BaseFollowFp32) {
  BF16_PRODUCTS_OR_SKIP();
  const uint32_t seed = 20261205;
  std::printf("seed=%u, rank 4, alpha 8, dropout 0.2 on all seven products\n", seed);
  const lt::Llama2Config cfg = tiny();
  lt::Llama2Model ref(cfg), m(cfg);
  ref.init_random(seed);
  m.params() = ref.params();
  lt::LoraConfig lc;
  lc.rank = 4, lc.alpha = 8, lc.dropout = 0.2f;
  ref.enable_lora(lc, seed + 1);
  std::mt19937 rng(seed + 2);
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (float& v : ref.lora_params()) v += nd(rng);
  m.enable_lora(lc, seed + 1);
  m.lora_params() = ref.lora_params();
  m.set_precision(lt::Precision::kBf16);
  ref.set_lora_dropout_stream(9);
  m.set_lora_dropout_stream(9);
  const std::vector<float> base = static_cast<const lt::Llama2Model&>(m).params();
  const lt::testing::PackedBatch pb(2, 48, {13, 20, 7, 30}, cfg.vocab_size, seed + 3);
  const lt::Batch batch = pb.view();
  const float dloss = 1.0f / float(pb.loss_tokens());
  const double ref_loss = ref.forward(batch);
  ref.backward(batch, dloss);
  const lt::TensorTable adapters = m.lora()->table();
  for (const lt::Recompute r : {lt::Recompute::kNone, lt::Recompute::kAttn, lt::Recompute::kFull}) {
    m.set_recompute(r);
    std::fill(m.lora_grads().begin(), m.lora_grads().end(), 0.f);
    const double loss = m.forward(batch);
    m.backward(batch, dloss);
    std::printf("[bf16 base, LoRA, %s] loss sum fp32 %.6f bf16 %.6f\n", lt::recompute_name(r), ref_loss, loss);
    EXPECT_NEAR(loss, ref_loss, 1e-2 * std::fabs(ref_loss)) << lt::recompute_name(r);
    const std::string tag = std::string("LoRA on bf16 ") + lt::recompute_name(r);
    lt::testing::expect_gradients_near(adapters, m.lora_grads().data(), ref.lora_grads().data(), 5e-2, tag.c_str());
  }
  const std::vector<float>& after = static_cast<const lt::Llama2Model&>(m).params();
  size_t changed = 0;
  for (size_t i = 0; i < base.size(); ++i) changed += after[i] != base[i];
  EXPECT_EQ(changed, 0u) << "base weights changed";
  EXPECT_TRUE(m.grads().empty()) << "a frozen base has no gradient buffer";
}

// Five AdamW steps from the same weights on the same batch: the bf16 pass's losses follow fp32 at
// every step. The bf16 copy of the weights must be made again after every update (params() marks
// it stale): a stale copy would repeat the first step's loss.
TEST(CpuBf16Model, TrainingStepsFollowFp32Losses) {
  BF16_PRODUCTS_OR_SKIP();
  const uint32_t seed = 7;
  std::printf("seed=%u\n", seed);
  const lt::Llama2Config cfg = tiny();
  Fp32AndBf16 pair(cfg, seed);
  lt::Llama2Model &ref = pair.ref, &m = pair.bf16;
  const size_t P = ref.layout().total();
  std::vector<float> mr(P), vr(P), mb(P), vb(P);
  const lt::testing::PackedBatch pb(2, 32, {32}, cfg.vocab_size, seed + 1);
  const lt::Batch batch = pb.view();
  const float dloss = 1.0f / float(pb.loss_tokens());
  std::vector<double> lr_, lb;
  for (int step = 1; step <= 5; ++step) {
    for (auto* x : {&ref, &m}) {
      x->clear_grads();
      (x == &ref ? lr_ : lb).push_back(x->forward(batch) * dloss);
      x->backward(batch, dloss);
      lt::cpu::adamw_update(x->params().data(), x == &ref ? mr.data() : mb.data(), x == &ref ? vr.data() : vb.data(),
                            x->grads().data(), P, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
    }
    std::printf("step %d loss fp32 %.6f bf16 %.6f\n", step, lr_.back(), lb.back());
    EXPECT_NEAR(lb.back(), lr_.back(), 1e-2 * lr_.back()) << "step " << step;
  }
  EXPECT_LT(lb.back(), lb.front() - 0.05) << "the bf16 model did not learn";
}

TEST(CpuBf16Model, InfoNamesTheIsaAndADoubleModelRefusesBf16) {
  const std::string report = lt::cpu_bf16_report();
  std::printf("cpu bf16: %s\n", report.c_str());
  EXPECT_TRUE(report.find("ISA ") != std::string::npos || report.find("unavailable: ") == 0) << report;
  lt::Llama2ModelT<double> d(tiny());
  EXPECT_THROW(d.set_precision(lt::Precision::kBf16), lt::Error);
}

// Item 2 of issue 19 on this AMX machine, with oneDNN held to a lesser ISA (ONEDNN_MAX_CPU_ISA):
// AVX-512 without AMX trains but warns it will be slower and why; AVX2, where oneDNN 2.x has no bf16
// products, is refused before any work with what to do instead.
TEST(CpuBf16Cli, WarnsWithoutAmxAndRefusesWithoutAvx512) {
  if (!onednn_or_skip()) GTEST_SKIP() << "oneDNN cannot be loaded";
  if (!lt::cpu::onednn::has_amx()) GTEST_SKIP() << "this CPU has no AMX: " << lt::cpu::onednn::effective_isa();
  const std::string dir = lt::testing::scratch_dir().string();
  const auto prep = lt::testing::run_cli("prepare --qa builtin:factqa --prompt-type 3 --vocab-size 512 --seq-len 64 "
                                         "--test-split 0.1 --seed 1 --output '" + dir + "/qa.h5'");
  ASSERT_EQ(prep.status, 0) << prep.err;
  const std::string train = "train --model-config tiny --data '" + dir + "/qa.h5' --max-steps 2 --device cpu "
                            "--precision bf16 --no-progress --output '" + dir + "/out";
  const auto amx = lt::testing::run_cli(train + "1'", 2);
  ASSERT_EQ(amx.status, 0) << amx.err;
  EXPECT_EQ(amx.err.find("SLOWER"), std::string::npos) << amx.err;
  const auto avx512 = lt::testing::run_captured("env OMP_NUM_THREADS=2 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 '" +
                                                std::string(LLAMATRAIN_BINARY) + "' " + train + "2'");
  ASSERT_EQ(avx512.status, 0) << avx512.err;
  EXPECT_NE(avx512.err.find("train: warning: --precision bf16 will be SLOWER than fp32 on this CPU: oneDNN's best ISA "
                            "here is avx512_core_bf16"),
            std::string::npos)
      << avx512.err;
  const auto avx2 = lt::testing::run_captured("env ONEDNN_MAX_CPU_ISA=AVX2 '" + std::string(LLAMATRAIN_BINARY) + "' " +
                                              train + "3'");
  EXPECT_EQ(avx2.status, 1) << avx2.err;
  EXPECT_NE(avx2.err.find("has no bf16 matrix products for this CPU's ISA, avx2"), std::string::npos) << avx2.err;
  const auto info = lt::testing::run_captured("env ONEDNN_MAX_CPU_ISA=AVX2 '" + std::string(LLAMATRAIN_BINARY) + "' info");
  EXPECT_NE(info.out.find("cpu bf16:     oneDNN"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("ISA avx2"), std::string::npos) << info.out;
}

}  // namespace
