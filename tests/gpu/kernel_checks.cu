// Correctness of every kernel family on the device: random inputs from fixed, printed seeds, a few
// shapes each (sizes that are not multiples of the block or tile sizes, and a Llama-2-7b-sized one),
// results copied back and compared with the CPU backend (lt::cpu, fp32 and fp64) by the rules of the
// simulator tests (tests/sim): the 2x-naive-bf16 rule with the worst element printed, NaN checks,
// sentinels in the padding, bitwise equality where the op is exact, determinism where promised.
// First: the CUDA runtime headers must precede the kernels' cuda_compat.cuh, whose simulator build
// (tests/gpu/sim) defines blockDim/gridDim as macros.
#include "gpu_check_util.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <random>
#include <vector>

#include "attention.cuh"
#include "attention_decode.cuh"
#include "attention_test_util.h"
#if defined(__CUDACC__)
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cudnn_library.h"
#endif
#include "crossentropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "kernel_cases.h"
#include "llamatrain/ops_cpu.h"
#include "optimizer.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"

namespace lt::gpucheck {
namespace {

using Bf16 = __nv_bfloat16;

uint16_t bits(Bf16 h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

template <class T>
int touched_tail(const std::vector<T>& v, size_t n) {
  int bad = 0;
  for (size_t k = n; k < v.size(); ++k) bad += static_cast<float>(v[k]) != kSentinel;
  return bad;
}

void seed_line(const char* what, const std::string& shape, unsigned seed) {
  std::printf("[%s] %s seed=%u\n", what, shape.c_str(), seed);
}

// ---- rmsnorm ---------------------------------------------------------------------------------------
constexpr float kRmsEps = 1e-5f;

void check_rmsnorm_forward(Checks& ck) {
  for (const kernelcases::Rmsnorm& s : kernelcases::kRmsnorm) {
    const unsigned seed = s.seed(1);
    seed_line("rmsnorm fwd", format("N=%d C=%d", s.N, s.C), seed);
    std::mt19937 rng(seed);
    const Bf16Matrix x = random_bf16(s.N, s.C, rng, 1.5f), w = random_bf16(1, s.C, rng, 1.f);
    Bf16Matrix out(s.N, s.C);
    std::vector<float> rstd(s.N + kPad, kSentinel);
    DeviceBuffer<Bf16> dx(x.data), dw(w.data), dout(out.data);
    DeviceBuffer<float> drstd(rstd);
    cuda::RmsnormForwardParams p;
    p.out = dout.get(), p.rstd = drstd.get(), p.x = dx.get(), p.weight = dw.get();
    p.N = s.N, p.C = s.C, p.x_row_stride = x.stride, p.out_row_stride = out.stride, p.eps = kRmsEps;
    cuda::rmsnorm_forward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    dout.download(out.data), drstd.download(rstd);

    const auto x32 = x.dense<float>(), w32 = w.dense<float>();
    const auto x64 = x.dense<double>(), w64 = w.dense<double>();
    std::vector<float> o32(x32.size()), r32(s.N);
    std::vector<double> o64(x64.size()), r64(s.N);
    cpu::rmsnorm_forward(o32.data(), r32.data(), x32.data(), w32.data(), s.N, s.C, kRmsEps);
    cpu::rmsnorm_forward(o64.data(), r64.data(), x64.data(), w64.data(), s.N, s.C, kRmsEps);
    compare_rule(ck, "out", out, o32, o64);
    double rstd_worst = 0.0;
    for (int i = 0; i < s.N; ++i) rstd_worst = std::max(rstd_worst, std::fabs(rstd[i] / r64[i] - 1.0));
    // fp32 sum of C squares: relative error grows with the reduction length (STYLE.md).
    const double tol = 1e-6 * (4 + std::sqrt(static_cast<double>(s.C)));
    std::printf("  rstd worst relative error %.3e (tol %.3e)\n", rstd_worst, tol);
    ck.expect(rstd_worst <= tol, format("rstd relative error %.3e > %.3e", rstd_worst, tol));
    ck.expect(touched_tail(rstd, s.N) == 0, "rstd written past N");
  }
}

void check_rmsnorm_backward(Checks& ck) {
  for (const kernelcases::Rmsnorm& s : kernelcases::kRmsnorm) {
    const unsigned seed = s.seed(2);
    seed_line("rmsnorm bwd", format("N=%d C=%d", s.N, s.C), seed);
    std::mt19937 rng(seed);
    const Bf16Matrix x = random_bf16(s.N, s.C, rng, 1.5f), w = random_bf16(1, s.C, rng, 1.f),
                     g = random_bf16(s.N, s.C, rng, 0.5f);
    const auto x32 = x.dense<float>(), w32 = w.dense<float>(), g32 = g.dense<float>();
    const auto x64 = x.dense<double>(), w64 = w.dense<double>(), g64 = g.dense<double>();
    std::vector<float> tmp(x32.size()), rstd(s.N);
    cpu::rmsnorm_forward(tmp.data(), rstd.data(), x32.data(), w32.data(), s.N, s.C, kRmsEps);
    const std::vector<double> rstd64(rstd.begin(), rstd.end());
    std::uniform_real_distribution<float> init(-1.f, 1.f);
    std::vector<float> dw0(s.C + kPad, kSentinel);
    for (int c = 0; c < s.C; ++c) dw0[c] = init(rng);  // the op accumulates (+=)

    Bf16Matrix dx(s.N, s.C);
    DeviceBuffer<Bf16> d_dx(dx.data), d_g(g.data), d_x(x.data), d_w(w.data);
    DeviceBuffer<float> d_dw(dw0), d_rstd(rstd), d_scratch(cuda::rmsnorm_backward_scratch_floats(s.N, s.C));
    cuda::RmsnormBackwardParams p;
    p.dx = d_dx.get(), p.dweight = d_dw.get(), p.scratch = d_scratch.get(), p.dout = d_g.get(), p.x = d_x.get();
    p.weight = d_w.get(), p.rstd = d_rstd.get(), p.N = s.N, p.C = s.C;
    p.dx_row_stride = dx.stride, p.dout_row_stride = g.stride, p.x_row_stride = x.stride;
    cuda::rmsnorm_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    d_dx.download(dx.data);
    const std::vector<float> dw = d_dw.host();
    // Determinism: the same call on the same prefill gives the same bits.
    d_dw.upload(dw0);
    cuda::rmsnorm_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    const std::vector<float> dw_again = d_dw.host();

    std::vector<float> dx32(x32.size()), dw32(s.C, 0.f);
    std::vector<double> dx64(x64.size()), dw64(s.C, 0.0);
    cpu::rmsnorm_backward(dx32.data(), dw32.data(), g32.data(), x32.data(), w32.data(), rstd.data(), s.N, s.C);
    cpu::rmsnorm_backward(dx64.data(), dw64.data(), g64.data(), x64.data(), w64.data(), rstd64.data(), s.N, s.C);
    compare_rule(ck, "dx", dx, dx32, dx64);
    ErrorReport dw_err;
    int dw_bad = 0;
    for (int c = 0; c < s.C; ++c) {
      // fp32 sums over N rows: eps_f32 * (N + 2) * sum |terms|, as the simulator test.
      double abs_sum = std::fabs(dw0[c]);
      for (int i = 0; i < s.N; ++i) abs_sum += std::fabs(g64[i * s.C + c] * x64[i * s.C + c] * rstd64[i]);
      const double ref = dw0[c] + dw64[c];
      dw_err.add(0, c, dw[c], ref);
      dw_bad += !(std::fabs(dw[c] - ref) <= 1.2e-7 * (s.N + 2) * abs_sum);
    }
    std::printf("  %s\n", describe("dweight (fp32) vs fp64", dw_err).c_str());
    ck.expect(dw_err.finite && dw_bad == 0, format("dweight: %d elements beyond the fp32 bound", dw_bad));
    ck.expect(touched_tail(dw, s.C) == 0, "dweight written past C");
    ck.expect(std::memcmp(dw.data(), dw_again.data(), dw.size() * sizeof(float)) == 0, "dweight differs between runs");
  }
}

// ---- rope --------------------------------------------------------------------------------------------
constexpr float kTheta = 10000.f;
void check_rope(Checks& ck, bool forward) {
  int index = 0;
  for (const kernelcases::Rope& c : kernelcases::kRope) {
    const unsigned seed = c.seed(index, forward ? 1 : 2);
    seed_line(forward ? "rope fwd" : "rope bwd",
              format("case %d: B=%d T=%d Hq=%d Hk=%d hd=%d head_pad=%d pos=%d in_place=%d", index, c.B, c.T, c.Hq,
                     c.Hk, c.hd, c.head_pad, static_cast<int>(c.pos), c.in_place),
              seed);
    ++index;
    std::mt19937 rng(seed);
    const int rows = c.B * c.T;
    Bf16Heads xq(rows, c.Hq, c.hd, c.head_pad), xk(rows, c.Hk, c.hd, c.head_pad);
    xq.fill_normal(rng, 1.5f), xk.fill_normal(rng, 1.5f);
    const std::vector<int32_t> pos = kernelcases::rope_positions(c, rng);
    const int32_t* host_pos = pos.empty() ? nullptr : pos.data();
    Bf16Heads oq(rows, c.Hq, c.hd, c.head_pad), ok(rows, c.Hk, c.hd, c.head_pad);
    DeviceBuffer<Bf16> d_xq(xq.data), d_xk(xk.data), d_oq(oq.data), d_ok(ok.data);
    DeviceBuffer<int32_t> d_pos(pos);
    cuda::RopeParams p;
    p.q.x = d_xq.get(), p.q.out = c.in_place ? d_xq.get() : d_oq.get(), p.q.H = c.Hq;
    p.q.x_token_stride = p.q.out_token_stride = xq.token_stride;
    p.q.x_head_stride = p.q.out_head_stride = xq.head_stride;
    if (c.Hk > 0) {  // else q only
      p.k.x = d_xk.get(), p.k.out = c.in_place ? d_xk.get() : d_ok.get(), p.k.H = c.Hk;
      p.k.x_token_stride = p.k.out_token_stride = xk.token_stride;
      p.k.x_head_stride = p.k.out_head_stride = xk.head_stride;
    }
    p.pos = host_pos ? d_pos.get() : nullptr, p.B = c.B, p.T = c.T, p.hd = c.hd, p.theta = kTheta;
    if (forward)
      cuda::rope_forward_cuda(p, nullptr);
    else
      cuda::rope_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    (c.in_place ? d_xq : d_oq).download(oq.data);
    (c.in_place ? d_xk : d_ok).download(ok.data);
    const Bf16Heads* ins[2] = {&xq, &xk};
    const Bf16Heads* outs[2] = {&oq, &ok};
    for (int t = 0; t < 2; ++t) {
      const int H = ins[t]->NH;
      if (H == 0) continue;
      const auto x32 = ins[t]->dense<float>();
      const auto x64 = ins[t]->dense<double>();
      std::vector<float> r32(x32.size());
      std::vector<double> r64(x64.size());
      if (forward) {
        cpu::rope_forward(r32.data(), x32.data(), host_pos, c.B, c.T, H, c.hd, kTheta);
        cpu::rope_forward(r64.data(), x64.data(), host_pos, c.B, c.T, H, c.hd, kTheta);
      } else {
        cpu::rope_backward(r32.data(), x32.data(), host_pos, c.B, c.T, H, c.hd, kTheta);
        cpu::rope_backward(r64.data(), x64.data(), host_pos, c.B, c.T, H, c.hd, kTheta);
      }
      compare_rule(ck, t == 0 ? "q" : "k", *outs[t], r32, r64);
    }
  }
}

// ---- swiglu ------------------------------------------------------------------------------------------

// The gate with its extremes: exp(-h1) overflowing, sigmoid saturating, 0.
Bf16Matrix gate_matrix(int N, int F, std::mt19937& rng) {
  Bf16Matrix m = random_bf16(N, F, rng, 3.f);
  const float special[] = {-100.f, 100.f, 0.f, -20.f, 20.f, -88.5f};
  if (N * F >= 6)
    for (int k = 0; k < 6; ++k) m.at(k % N, (k * 7) % F) = __float2bfloat16(special[k]);
  return m;
}

void check_swiglu_forward(Checks& ck) {
  for (const kernelcases::Swiglu& s : kernelcases::kSwiglu) {
    const unsigned seed = s.seed(1);
    seed_line("swiglu fwd", format("N=%d F=%d", s.N, s.F), seed);
    std::mt19937 rng(seed);
    const Bf16Matrix h1 = gate_matrix(s.N, s.F, rng), h3 = random_bf16(s.N, s.F, rng, 1.f);
    Bf16Matrix out(s.N, s.F);
    DeviceBuffer<Bf16> d1(h1.data), d3(h3.data), dout(out.data);
    cuda::SwigluForwardParams p;
    p.out = dout.get(), p.h1 = d1.get(), p.h3 = d3.get(), p.N = s.N, p.F = s.F;
    p.out_row_stride = out.stride, p.h1_row_stride = h1.stride, p.h3_row_stride = h3.stride;
    cuda::swiglu_forward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    dout.download(out.data);
    const auto a32 = h1.dense<float>(), b32 = h3.dense<float>();
    const auto a64 = h1.dense<double>(), b64 = h3.dense<double>();
    std::vector<float> r32(a32.size());
    std::vector<double> r64(a64.size());
    cpu::swiglu_forward(r32.data(), a32.data(), b32.data(), s.N, s.F);
    cpu::swiglu_forward(r64.data(), a64.data(), b64.data(), s.N, s.F);
    compare_rule(ck, "out", out, r32, r64);
  }
}

void check_swiglu_backward(Checks& ck) {
  for (const kernelcases::Swiglu& s : kernelcases::kSwiglu) {
    const unsigned seed = s.seed(2);
    seed_line("swiglu bwd", format("N=%d F=%d", s.N, s.F), seed);
    std::mt19937 rng(seed);
    const Bf16Matrix h1 = gate_matrix(s.N, s.F, rng), h3 = random_bf16(s.N, s.F, rng, 1.f),
                     g = random_bf16(s.N, s.F, rng, 1.f);
    Bf16Matrix dh1(s.N, s.F), dh3(s.N, s.F);
    DeviceBuffer<Bf16> d1(h1.data), d3(h3.data), dg(g.data), o1(dh1.data), o3(dh3.data);
    cuda::SwigluBackwardParams p;
    p.dh1 = o1.get(), p.dh3 = o3.get(), p.dout = dg.get(), p.h1 = d1.get(), p.h3 = d3.get(), p.N = s.N, p.F = s.F;
    p.dh1_row_stride = dh1.stride, p.dh3_row_stride = dh3.stride, p.dout_row_stride = g.stride;
    p.h1_row_stride = h1.stride, p.h3_row_stride = h3.stride;
    cuda::swiglu_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    o1.download(dh1.data), o3.download(dh3.data);
    const auto a32 = h1.dense<float>(), b32 = h3.dense<float>(), g32 = g.dense<float>();
    const auto a64 = h1.dense<double>(), b64 = h3.dense<double>(), g64 = g.dense<double>();
    std::vector<float> r1(a32.size()), r3(a32.size());
    std::vector<double> q1(a64.size()), q3(a64.size());
    cpu::swiglu_backward(r1.data(), r3.data(), g32.data(), a32.data(), b32.data(), s.N, s.F);
    cpu::swiglu_backward(q1.data(), q3.data(), g64.data(), a64.data(), b64.data(), s.N, s.F);
    compare_rule(ck, "dh1", dh1, r1, q1);
    compare_rule(ck, "dh3", dh3, r3, q3);
  }
}

// ---- embedding ---------------------------------------------------------------------------------------
using EmbShape = kernelcases::Embedding;

std::vector<int32_t> random_tokens(const EmbShape& s, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, s.V - 1);
  std::vector<int32_t> t(s.N);
  for (auto& v : t) v = dist(rng);
  t[0] = 0, t[s.N - 1] = s.V - 1;
  if (s.N > 3) t[s.N / 2] = t[1];  // a repeat even when V is large
  return t;
}

void check_embedding_forward(Checks& ck) {
  for (const EmbShape& s : kernelcases::kEmbedding) {
    const unsigned seed = s.seed(1);
    seed_line("embedding fwd", format("N=%d V=%d C=%d", s.N, s.V, s.C), seed);
    std::mt19937 rng(seed);
    const std::vector<int32_t> tokens = random_tokens(s, rng);
    const Bf16Matrix wte = random_bf16(s.V, s.C, rng, 1.f);
    Bf16Matrix out(s.N, s.C);
    DeviceBuffer<Bf16> d_wte(wte.data), d_out(out.data);
    DeviceBuffer<int32_t> d_tok(tokens);
    cuda::EmbeddingForwardParams p;
    p.out = d_out.get(), p.tokens = d_tok.get(), p.wte = d_wte.get(), p.N = s.N, p.C = s.C;
    p.out_row_stride = out.stride, p.wte_row_stride = wte.stride;
    cuda::embedding_forward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    d_out.download(out.data);
    const auto w32 = wte.dense<float>();
    std::vector<float> ref(static_cast<size_t>(s.N) * s.C);
    cpu::embedding_forward(ref.data(), tokens.data(), w32.data(), s.N, s.C);
    int bad = 0;
    for (int i = 0; i < s.N; ++i)
      for (int c = 0; c < s.C; ++c)
        bad += out.get(i, c) != ref[static_cast<size_t>(i) * s.C + c] ||
               bits(out.data[i * out.stride + c]) != bits(wte.data[tokens[i] * wte.stride + c]);
    std::printf("  %d elements differ from the CPU gather\n", bad);
    ck.expect(bad == 0, format("%d elements differ from the CPU gather", bad));
    ck.expect(out.touched_padding() == 0, "out padding written");
  }
}

void check_embedding_backward(Checks& ck) {
  for (const EmbShape& s : kernelcases::kEmbedding) {
    const unsigned seed = s.seed(2);
    seed_line("embedding bwd", format("N=%d V=%d C=%d", s.N, s.V, s.C), seed);
    std::mt19937 rng(seed);
    const std::vector<int32_t> tokens = random_tokens(s, rng);
    const Bf16Matrix g = random_bf16(s.N, s.C, rng, 1.f);
    const int64_t ws = s.C + 5;  // dwte row stride: padded
    std::normal_distribution<float> dist(0.f, 0.25f);
    std::vector<float> dwte0(static_cast<size_t>(s.V) * ws + kPad, kSentinel), ref(static_cast<size_t>(s.V) * s.C);
    for (int v = 0; v < s.V; ++v)
      for (int c = 0; c < s.C; ++c) dwte0[v * ws + c] = ref[static_cast<size_t>(v) * s.C + c] = dist(rng);  // +=
    const cuda::EmbeddingBackwardPlan plan = cuda::embedding_backward_plan(tokens.data(), s.N, s.V);
    DeviceBuffer<Bf16> d_g(g.data);
    DeviceBuffer<float> d_dwte(dwte0);
    DeviceBuffer<int32_t> d_plan(plan.data);
    cuda::EmbeddingBackwardParams p;
    p.dwte = d_dwte.get(), p.dout = d_g.get(), p.plan = d_plan.get(), p.n_rows = plan.n_rows;
    p.N = s.N, p.C = s.C, p.dwte_row_stride = ws, p.dout_row_stride = g.stride;
    cuda::embedding_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    const std::vector<float> a = d_dwte.host();
    d_dwte.upload(dwte0);
    cuda::embedding_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    const std::vector<float> b = d_dwte.host();
    const auto g32 = g.dense<float>();
    cpu::embedding_backward(ref.data(), g32.data(), tokens.data(), s.N, s.V, s.C);
    int mismatches = 0, touched = 0;
    for (int v = 0; v < s.V; ++v)
      for (int c = 0; c < s.C; ++c) mismatches += std::memcmp(&a[v * ws + c], &ref[static_cast<size_t>(v) * s.C + c], 4) != 0;
    for (size_t k = 0; k < a.size(); ++k)
      if (static_cast<int64_t>(k) >= s.V * ws || static_cast<int64_t>(k % ws) >= s.C) touched += a[k] != kSentinel;
    std::printf("  %d bit mismatches against the CPU op\n", mismatches);
    ck.expect(mismatches == 0, format("%d elements differ from the CPU op (must be bitwise)", mismatches));
    ck.expect(touched == 0, "dwte padding written");
    ck.expect(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "two runs differ");
  }
}

// ---- cross-entropy -----------------------------------------------------------------------------------
constexpr float kDloss = 1.0f / 37.0f;
using CeShape = kernelcases::Crossentropy;

struct CeCase {
  Bf16Matrix logits;
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;
};

CeCase make_ce_case(const CeShape& s, std::mt19937& rng) {
  CeCase k{Bf16Matrix(s.N, s.V), {}, {}};
  std::normal_distribution<float> normal(0.f, s.scale > 0 ? s.scale : 1.f);
  std::uniform_real_distribution<float> uni(-std::fabs(s.scale), std::fabs(s.scale));
  std::uniform_int_distribution<int> tgt(0, s.V - 1);
  for (int i = 0; i < s.N; ++i)
    for (int c = 0; c < s.V; ++c) k.logits.at(i, c) = __float2bfloat16(s.scale > 0 ? normal(rng) : uni(rng));
  for (int i = 0; i < s.N; ++i) k.mask.push_back(s.use_mask && i % 3 == 2 ? 0 : 1);
  for (int i = 0; i < s.N; ++i) k.targets.push_back(k.mask[i] ? tgt(rng) : -1);  // masked: never read
  return k;
}

void check_crossentropy(Checks& ck, bool forward) {
  for (const CeShape& s : kernelcases::kCrossentropy) {
    const unsigned seed = s.seed(forward ? 1 : 2);
    seed_line(forward ? "crossentropy fwd" : "crossentropy bwd",
              format("N=%d V=%d scale=%g mask=%d", s.N, s.V, s.scale, s.use_mask), seed);
    std::mt19937 rng(seed);
    const CeCase k = make_ce_case(s, rng);
    const uint8_t* mask = s.use_mask ? k.mask.data() : nullptr;
    std::vector<float> losses(s.N + kPad, kSentinel), lse(s.N + kPad, kSentinel);
    DeviceBuffer<Bf16> d_logits(k.logits.data);
    DeviceBuffer<int32_t> d_t(k.targets);
    DeviceBuffer<uint8_t> d_mask(k.mask);
    DeviceBuffer<float> d_losses(losses), d_lse(lse);
    DeviceBuffer<double> d_sum(std::vector<double>{-1.0, -7.0});
    cuda::CrossentropyForwardParams fp;
    fp.losses = d_losses.get(), fp.lse = d_lse.get(), fp.loss_sum = d_sum.get(), fp.logits = d_logits.get();
    fp.targets = d_t.get(), fp.mask = s.use_mask ? d_mask.get() : nullptr;
    fp.N = s.N, fp.V = s.V, fp.logits_row_stride = k.logits.stride;
    cuda::crossentropy_forward_cuda(fp, nullptr);
    LT_GPUCHECK_SYNC();
    d_losses.download(losses), d_lse.download(lse);
    const std::vector<double> sum = d_sum.host();
    const auto l32 = k.logits.dense<float>();
    const auto l64 = k.logits.dense<double>();

    if (forward) {
      std::vector<float> loss32(s.N), lse32(s.N);
      std::vector<double> loss64(s.N), lse64(s.N);
      cpu::crossentropy_forward(loss32.data(), lse32.data(), l32.data(), k.targets.data(), mask, s.N, s.V);
      const double sum64 =
          cpu::crossentropy_forward(loss64.data(), lse64.data(), l64.data(), k.targets.data(), mask, s.N, s.V);
      ErrorReport loss_k, loss_n, lse_k, lse_n;
      int fp32_bad = 0, masked_nonzero = 0;
      double sum_tol = 0.0;
      for (int i = 0; i < s.N; ++i) {
        loss_k.add(i, 0, losses[i], loss64[i]), loss_n.add(i, 0, bf(loss32[i]), loss64[i]);
        lse_k.add(i, 0, lse[i], lse64[i]), lse_n.add(i, 0, bf(lse32[i]), lse64[i]);
        // fp32: lse = m + log(s), s an fp32 sum of V exps (relative error ~ eps (V/256 + 16)).
        const double tol = 2.4e-7 * (2.0 * std::fabs(lse64[i]) + 16.0 + s.V / 256.0);
        fp32_bad += !(std::fabs(lse[i] - lse64[i]) <= tol);
        if (k.mask[i]) {
          fp32_bad += !(std::fabs(losses[i] - loss64[i]) <= tol);
          sum_tol += tol;
        } else {
          masked_nonzero += losses[i] != 0.f;
        }
      }
      expect_rule(ck, "loss", loss_k, loss_n);
      expect_rule(ck, "lse", lse_k, lse_n);
      std::printf("  loss sum %.10g, fp64 %.10g, |err| %.3e (tol %.3e)\n", sum[0], sum64, std::fabs(sum[0] - sum64),
                  sum_tol);
      ck.expect(lse_k.finite && std::isfinite(sum[0]), "NaN/Inf in lse or the loss sum");
      ck.expect(fp32_bad == 0, format("%d losses/lse beyond the fp32 bound", fp32_bad));
      ck.expect(masked_nonzero == 0, "masked rows must have loss 0");
      ck.expect(std::fabs(sum[0] - sum64) <= sum_tol + 1e-12, "loss sum beyond the fp32 bound");
      ck.expect(sum[1] == -7.0, "loss_sum written past its element");
      ck.expect(touched_tail(losses, s.N) == 0 && touched_tail(lse, s.N) == 0, "losses/lse written past N");
      // The loss sum has a fixed order: a second launch gives the same bits.
      cuda::crossentropy_forward_cuda(fp, nullptr);
      LT_GPUCHECK_SYNC();
      const std::vector<double> sum2 = d_sum.host();
      ck.expect(std::memcmp(&sum[0], &sum2[0], sizeof(double)) == 0, "loss sum differs between runs");
    } else {
      Bf16Matrix dl(s.N, s.V);
      DeviceBuffer<Bf16> d_dl(dl.data);
      cuda::CrossentropyBackwardParams p;
      p.dlogits = d_dl.get(), p.logits = d_logits.get(), p.lse = d_lse.get(), p.targets = d_t.get();
      p.mask = fp.mask, p.dloss = kDloss, p.N = s.N, p.V = s.V;
      p.dlogits_row_stride = dl.stride, p.logits_row_stride = k.logits.stride;
      cuda::crossentropy_backward_cuda(p, nullptr);
      LT_GPUCHECK_SYNC();
      d_dl.download(dl.data);
      // References from the kernel's own fp32 lse cache, as the kernel uses it.
      const std::vector<float> lse32(lse.begin(), lse.begin() + s.N);
      const std::vector<double> lse64(lse32.begin(), lse32.end());
      std::vector<float> d32(l32.size());
      std::vector<double> d64(l64.size());
      cpu::crossentropy_backward(d32.data(), l32.data(), lse32.data(), k.targets.data(), mask, kDloss, s.N, s.V);
      cpu::crossentropy_backward(d64.data(), l64.data(), lse64.data(), k.targets.data(), mask, kDloss, s.N, s.V);
      compare_rule(ck, "dlogits", dl, d32, d64);
      int masked_nonzero = 0;
      for (int i = 0; i < s.N; ++i)
        if (!k.mask[i])
          for (int c = 0; c < s.V; ++c) masked_nonzero += dl.get(i, c) != 0.f;
      ck.expect(masked_nonzero == 0, "masked rows must have dlogits 0");
    }
  }
}

// ---- attention ---------------------------------------------------------------------------------------
namespace attn = simtest::attention;

// The inputs of one attention case as the simulator's tests make them (attention_test_util.h:
// separate or fused q, k, v, padded heads, seg_start) on the host, and their copies on the device.
struct AttnCase {
  attn::Case h;
  DeviceBuffer<Bf16> d_qkv, d_k, d_v, d_out, d_dout, d_dqkv, d_dk, d_dv;
  DeviceBuffer<float> d_lse, d_dsum;
  DeviceBuffer<int32_t> d_seg;

  AttnCase(const attn::Shape& s, unsigned seed) : h(s) {
    attn::make_inputs(h, seed);
    d_qkv = DeviceBuffer<Bf16>(h.qkv_buf.data), d_k = DeviceBuffer<Bf16>(h.k_buf.data);
    d_v = DeviceBuffer<Bf16>(h.v_buf.data), d_out = DeviceBuffer<Bf16>(h.out.data);
    d_dout = DeviceBuffer<Bf16>(h.dout.data), d_dqkv = DeviceBuffer<Bf16>(h.dqkv_buf.data);
    d_dk = DeviceBuffer<Bf16>(h.dk_buf.data), d_dv = DeviceBuffer<Bf16>(h.dv_buf.data);
    d_lse = DeviceBuffer<float>(h.lse), d_dsum = DeviceBuffer<float>(h.dsum), d_seg = DeviceBuffer<int32_t>(h.seg);
  }
  // The host case's parameters, each pointer moved into its buffer's device copy.
  cuda::AttentionParams params() {
    cuda::AttentionParams p = h.params();
    p.out = moved(p.out, h.out, d_out), p.dout = moved(p.dout, h.dout, d_dout);
    p.q = moved(p.q, *h.q.buf, device_of(h.q)), p.k = moved(p.k, *h.k.buf, device_of(h.k));
    p.v = moved(p.v, *h.v.buf, device_of(h.v)), p.dq = moved(p.dq, *h.dq.buf, device_of(h.dq));
    p.dk = moved(p.dk, *h.dk.buf, device_of(h.dk)), p.dv = moved(p.dv, *h.dv.buf, device_of(h.dv));
    p.lse = d_lse.get(), p.dsum = d_dsum.get(), p.seg_start = h.seg.empty() ? nullptr : d_seg.get();
    return p;
  }
  // The forward's outputs, then the backward's, back into the host case.
  void download_forward() { d_out.download(h.out.data), d_lse.download(h.lse); }
  void download_backward() {
    download_forward();
    d_dsum.download(h.dsum), d_dqkv.download(h.dqkv_buf.data), d_dk.download(h.dk_buf.data);
    d_dv.download(h.dv_buf.data);
  }
  const DeviceBuffer<Bf16>& device_of(const attn::View& v) const {
    const attn::Heads* b = v.buf;
    return b == &h.qkv_buf ? d_qkv : b == &h.k_buf ? d_k : b == &h.v_buf ? d_v : b == &h.dqkv_buf ? d_dqkv
                                                                            : b == &h.dk_buf ? d_dk : d_dv;
  }

 private:
  template <class T>
  static cuda::AttentionHeads<T> moved(cuda::AttentionHeads<T> v, const attn::Heads& host, const DeviceBuffer<Bf16>& d) {
    v.ptr = d.get() + (v.ptr - host.data.data());
    return v;
  }
};

std::string attn_shape(const attn::Shape& s) {
  static const char* kSeg[] = {"none", "packed", "odd"};
  return format("B=%d T=%d H=%d KVH=%d hd=%d seg=%s fused=%d head_pad=%d qk_std=%g", s.B, s.T, s.H, s.KVH, s.hd,
                kSeg[static_cast<int>(s.seg)], s.fused, s.head_pad, s.qk_std);
}

// An output of the attention kernels by their rule (attention_test_util.h: element by element
// within the bf16 rounding of the fp32 result and, for the tensor-core kernels, of their operands;
// the worst error within 2x the naive bf16 computation's plus the fp32 floor). The CUDA-core
// kernels: no operand or fp32 terms.
void compare_attention_rule(Checks& ck, const std::string& what, const attn::View& got, const std::vector<float>& r32,
                            const std::vector<double>& r64, const std::vector<double>& operand_abs,
                            const std::vector<double>& fp32_term) {
  const attn::Comparison c = attn::compare(got, r32, r64, operand_abs, fp32_term);
  std::printf("  %s\n  %s\n  %s kernel/naive ratio %.3f (bound 2, fp32 floor %.2g), per-element bound used %.3g, "
              "%d beyond\n",
              describe((what + " kernel vs fp64").c_str(), c.kernel).c_str(),
              describe((what + " naive bf16 vs fp64").c_str(), c.naive).c_str(), what.c_str(),
              c.naive.worst > 0 ? c.kernel.worst / c.naive.worst : 0.0, c.floor, c.worst_bound_use, c.violations);
  ck.expect(c.kernel.finite, what + ": NaN/Inf in the kernel's output");
  ck.expect(c.kernel.worst <= 2.0 * c.naive.worst + c.floor,
            describe((what + " beyond 2x naive bf16 plus the fp32 floor").c_str(), c.kernel));
  ck.expect(c.violations == 0, what + ": beyond the per-element bound, first at " + c.first_violation);
  ck.expect(got.buf->touched_padding() == 0, what + ": padding written");
}

// A (rows, nh, hd) view of a result against dense references, as compare_rule for Bf16Heads.
void compare_rule(Checks& ck, const std::string& what, const attn::View& got, const std::vector<float>& r32,
                  const std::vector<double>& r64) {
  ErrorReport kernel, naive;
  const int hd = got.buf->hd;
  for (int r = 0; r < got.buf->rows; ++r)
    for (int h = 0; h < got.nh; ++h)
      for (int c = 0; c < hd; ++c) {
        const size_t k = (static_cast<size_t>(r) * got.nh + h) * hd + c;
        kernel.add(r, h * hd + c, got.get(r, h, c), r64[k]);
        naive.add(r, h * hd + c, bf(r32[k]), r64[k]);
      }
  expect_rule(ck, what, kernel, naive);
  ck.expect(got.buf->touched_padding() == 0, what + ": padding written");
}

// The forward outputs already in c.out and c.lse against the CPU reference: out by the 2x-naive-bf16
// rule, lse (fp32) within a bound on its rounding error, -inf exactly on empty rows.
// Which rule an attention output is held to: ours by attention_test_util.h's (the tensor-core
// kernels with their operand terms); cuDNN's, whose internals we do not know, by the 2x-naive one.
enum class AttnRule { kCudaCores, kTensorCores, kCudnn };

void compare_attention_forward(Checks& ck, const AttnCase& ac, AttnRule rule) {
  const attn::Case& c = ac.h;
  const attn::Shape& s = c.s;
  const auto q32 = c.q.dense<float>(), k32 = c.k.dense<float>(), v32 = c.v.dense<float>();
  const auto q64 = c.q.dense<double>(), k64 = c.k.dense<double>(), v64 = c.v.dense<double>();
  std::vector<float> o32(q32.size()), l32(static_cast<size_t>(s.B) * s.H * s.T);
  std::vector<double> o64(q32.size()), l64(l32.size());
  cpu::attention_forward(o32.data(), l32.data(), q32.data(), k32.data(), v32.data(), c.seg_ptr(), s.B, s.T, s.H,
                         s.KVH, s.hd);
  cpu::attention_forward(o64.data(), l64.data(), q64.data(), k64.data(), v64.data(), c.seg_ptr(), s.B, s.T, s.H,
                         s.KVH, s.hd);
  const attn::View out{const_cast<attn::Heads*>(&c.out), 0, s.H};
  const std::vector<double> none(o32.size(), 0.0);
  if (rule == AttnRule::kCudnn) compare_rule(ck, "out", out, o32, o64);
  else if (rule == AttnRule::kCudaCores) compare_attention_rule(ck, "out", out, o32, o64, none, none);
  else compare_attention_rule(ck, "out", out, o32, o64, attn::fp64_terms(c, false).out_abs, none);
  // lse (fp32): score rounding ~ 2^-24 hd max|q| max|k| sqrt(hd), plus a few ulps of |lse| and T of the sum.
  double qmax = 0, kmax = 0;
  for (float x : q32) qmax = std::max(qmax, static_cast<double>(std::fabs(x)));
  for (float x : k32) kmax = std::max(kmax, static_cast<double>(std::fabs(x)));
  const double score_err = std::ldexp(1.0, -24) * s.hd * qmax * kmax * std::sqrt(static_cast<double>(s.hd));
  ErrorReport lse_err;
  int lse_bad = 0, inf_mismatch = 0;
  for (size_t i = 0; i < l64.size(); ++i) {
    if (std::isinf(l64[i])) {  // an empty row: -inf in both
      inf_mismatch += !(std::isinf(c.lse[i]) && c.lse[i] < 0);
      continue;
    }
    lse_err.add(static_cast<int>(i), 0, c.lse[i], l64[i]);
    lse_bad += !(std::fabs(c.lse[i] - l64[i]) <= score_err + std::ldexp(1.0, -22) * (std::fabs(l64[i]) + s.T));
  }
  std::printf("  %s (score error bound %.3g)\n", describe("lse kernel vs fp64", lse_err).c_str(), score_err);
  ck.expect(lse_err.finite && lse_bad == 0, format("%d lse values beyond the fp32 bound", lse_bad));
  ck.expect(inf_mismatch == 0, "empty rows must have lse = -inf");
  ck.expect(touched_tail(c.lse, l64.size()) == 0, "lse written past B*H*T");
}

// Each case of the table on the CUDA-core kernels by the 2x-naive rule, with AttentionSim's seeds;
// and each at head_dim 64 and 128 on the tensor-core ones (what training picks there) by their
// rule, with AttentionTcSim's seeds (attention_test_util.h): what the simulator's tests check.
struct AttnRun {
  attn::Shape shape;
  cuda::AttentionKernel kernel;
  unsigned seed;
};
std::vector<AttnRun> attention_runs(bool backward) {
  std::vector<AttnRun> runs;
  for (const attn::Shape& s : kernelcases::kAttention)
    runs.push_back({s, cuda::AttentionKernel::kCudaCores, s.seed(backward ? 2 : 1)});
  for (const attn::Shape& s : kernelcases::kAttention)
    for (const attn::Shape& t : attn::tc_variants(s))
      runs.push_back({t, cuda::AttentionKernel::kTensorCores,
                      t.seed(backward ? attn::kTcBackwardSalt : attn::kTcForwardSalt)});
  return runs;
}
AttnRule rule_of(cuda::AttentionKernel k) {
  return k == cuda::AttentionKernel::kTensorCores ? AttnRule::kTensorCores : AttnRule::kCudaCores;
}
const char* kernel_name(cuda::AttentionKernel k) {
  return k == cuda::AttentionKernel::kTensorCores ? "tensor cores" : "CUDA cores";
}

void check_attention_forward(Checks& ck) {
  for (const AttnRun& run : attention_runs(false)) {
    seed_line("attention fwd", attn_shape(run.shape) + ", " + kernel_name(run.kernel), run.seed);
    AttnCase c(run.shape, run.seed);
    c.h.kernel = run.kernel;
    cuda::attention_forward_cuda(c.params(), nullptr);
    LT_GPUCHECK_SYNC();
    c.download_forward();
    compare_attention_forward(ck, c, rule_of(run.kernel));
  }
}

// ---- attention_decode: one query per head against a KV cache -----------------------------------------

void check_attention_decode(Checks& ck) {
  for (const kernelcases::Decode& s : kernelcases::kDecode) {
    const unsigned seed = s.seed();
    seed_line("attention decode", format("n=%d H=%d KVH=%d hd=%d (cache rows padded)", s.n, s.H, s.KVH, s.hd), seed);
    std::mt19937 rng(seed);
    // The cache's rows carry kPad elements of padding: kv_stride is not KVH * hd.
    const Bf16Matrix q = random_bf16(1, s.H * s.hd, rng, 0.5f), k = random_bf16(s.n, s.KVH * s.hd, rng, 0.5f),
                     v = random_bf16(s.n, s.KVH * s.hd, rng, 1.f);
    Bf16Matrix out(1, s.H * s.hd);
    DeviceBuffer<Bf16> dq(q.data), dk(k.data), dv(v.data), dout(out.data);
    cuda::AttentionDecodeParams p;
    p.out = dout.get(), p.q = dq.get(), p.k = dk.get(), p.v = dv.get(), p.kv_stride = k.stride;
    p.n = s.n, p.H = s.H, p.KVH = s.KVH, p.hd = s.hd;
    cuda::attention_decode_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    dout.download(out.data);
    const int64_t dense = int64_t(s.KVH) * s.hd;
    const auto q32 = q.dense<float>(), k32 = k.dense<float>(), v32 = v.dense<float>();
    const auto q64 = q.dense<double>(), k64 = k.dense<double>(), v64 = v.dense<double>();
    std::vector<float> r32(q32.size());
    std::vector<double> r64(q64.size());
    cpu::attention_decode(r32.data(), q32.data(), k32.data(), v32.data(), dense, s.n, s.H, s.KVH, s.hd);
    cpu::attention_decode(r64.data(), q64.data(), k64.data(), v64.data(), dense, s.n, s.H, s.KVH, s.hd);
    compare_rule(ck, "out", out, r32, r64);
  }
}

// The backward outputs already in c.dq, c.dk, c.dv (and the forward's c.out, c.lse) against the CPU
// reference by the 2x-naive-bf16 rule. The references get the kernel's own forward outputs (bf16
// out, fp32 lse), as the kernel does.
void compare_attention_backward(Checks& ck, const AttnCase& ac, AttnRule rule) {
  const attn::Case& c = ac.h;
  const attn::Shape& s = c.s;
  const size_t n_stat = static_cast<size_t>(s.B) * s.H * s.T;
  auto* out_buf = const_cast<attn::Heads*>(&c.out);
  auto* dout_buf = const_cast<attn::Heads*>(&c.dout);
  const attn::View out{out_buf, 0, s.H}, dout{dout_buf, 0, s.H};
  const auto q32 = c.q.dense<float>(), k32 = c.k.dense<float>(), v32 = c.v.dense<float>();
  const auto o32 = out.dense<float>(), g32 = dout.dense<float>();
  const auto q64 = c.q.dense<double>(), k64 = c.k.dense<double>(), v64 = c.v.dense<double>();
  const auto o64 = out.dense<double>(), g64 = dout.dense<double>();
  const std::vector<float> l32(c.lse.begin(), c.lse.begin() + n_stat);
  const std::vector<double> l64(l32.begin(), l32.end());
  std::vector<float> dq32(q32.size()), dk32(k32.size()), dv32(v32.size());
  std::vector<double> dq64(q32.size()), dk64(k32.size()), dv64(v32.size());
  cpu::attention_backward(dq32.data(), dk32.data(), dv32.data(), g32.data(), o32.data(), l32.data(), q32.data(),
                          k32.data(), v32.data(), c.seg_ptr(), s.B, s.T, s.H, s.KVH, s.hd);
  cpu::attention_backward(dq64.data(), dk64.data(), dv64.data(), g64.data(), o64.data(), l64.data(), q64.data(),
                          k64.data(), v64.data(), c.seg_ptr(), s.B, s.T, s.H, s.KVH, s.hd);
  if (rule == AttnRule::kCudnn) {
    compare_rule(ck, "dq", c.dq, dq32, dq64);
    compare_rule(ck, "dk", c.dk, dk32, dk64);
    compare_rule(ck, "dv", c.dv, dv32, dv64);
  } else if (rule == AttnRule::kTensorCores) {
    const attn::Fp64Terms terms = attn::fp64_terms(c, true);
    compare_attention_rule(ck, "dq", c.dq, dq32, dq64, terms.dq_abs, terms.dq_f32);
    compare_attention_rule(ck, "dk", c.dk, dk32, dk64, terms.dk_abs, terms.dk_f32);
    compare_attention_rule(ck, "dv", c.dv, dv32, dv64, terms.dv_abs, terms.zero_kv);
  } else {
    const std::vector<double> nq(dq32.size(), 0.0), nkv(dk32.size(), 0.0);
    compare_attention_rule(ck, "dq", c.dq, dq32, dq64, nq, nq);
    compare_attention_rule(ck, "dk", c.dk, dk32, dk64, nkv, nkv);
    compare_attention_rule(ck, "dv", c.dv, dv32, dv64, nkv, nkv);
  }
  ck.expect(touched_tail(c.dsum, n_stat) == 0, "dsum written past B*H*T");
}

// Determinism on real hardware: the backward pass again over NaN-filled gradient buffers gives
// the same bits in every element of dq, dk and dv.
void check_backward_determinism(Checks& ck, AttnCase& c, const cuda::AttentionParams& p) {
  const Bf16 nan = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
  for (DeviceBuffer<Bf16>* d : {&c.d_dqkv, &c.d_dk, &c.d_dv}) d->upload(std::vector<Bf16>(d->size(), nan));
  cuda::attention_backward_cuda(p, nullptr);
  LT_GPUCHECK_SYNC();
  int diff = 0;
  for (const attn::View* v : {&c.h.dq, &c.h.dk, &c.h.dv}) {
    const std::vector<Bf16> again = c.device_of(*v).host();
    const attn::Heads& b = *v->buf;
    for (int r = 0; r < b.rows; ++r)
      for (int hh = v->h0; hh < v->h0 + v->nh; ++hh)
        for (int x = 0; x < b.hd; ++x) diff += bits(again[size_t(b.index(r, hh, x))]) != bits(b.data[size_t(b.index(r, hh, x))]);
  }
  ck.expect(diff == 0, format("backward not deterministic: %d elements differ between runs", diff));
}

void check_attention_backward(Checks& ck) {
  for (const AttnRun& run : attention_runs(true)) {
    seed_line("attention bwd", attn_shape(run.shape) + ", " + kernel_name(run.kernel), run.seed);
    AttnCase c(run.shape, run.seed);
    c.h.kernel = run.kernel;
    const cuda::AttentionParams p = c.params();
    cuda::attention_forward_cuda(p, nullptr);
    cuda::attention_backward_cuda(p, nullptr);
    LT_GPUCHECK_SYNC();
    c.download_backward();
    check_backward_determinism(ck, c, p);
    compare_attention_backward(ck, c, rule_of(run.kernel));
  }
}

// ---- cuDNN's fused attention (--attention cudnn), by the same rules ----------------------------------
// GPU build only: the simulator build of this file has no cuDNN, and its entries are skipped.
#if defined(__CUDACC__)
// One example per row (cuDNN's causal mask); GQA, MQA, padded head strides, large scores, B = 2.
const attn::Shape kCudnnShapes[] = {
    {1, 70, 4, 2, 32, attn::Seg::kNone, false, 8, 1.f},   {1, 100, 2, 1, 64, attn::Seg::kNone, false, 8, 1.f},
    {1, 45, 2, 2, 128, attn::Seg::kNone, false, 8, 3.f},  {2, 333, 4, 4, 128, attn::Seg::kNone, false, 0, 1.f},
};

void check_cudnn_forward(Checks& ck) {
  for (const attn::Shape& s : kCudnnShapes) {
    const unsigned seed = s.seed(3);
    seed_line("cudnn attention fwd", attn_shape(s), seed);
    AttnCase c(s, seed);
    cuda::cudnn_attention_forward(c.params(), nullptr);
    LT_GPUCHECK_SYNC();
    c.download_forward();
    compare_attention_forward(ck, c, AttnRule::kCudnn);
  }
  // Packed examples cannot be expressed as cuDNN's causal mask: refused, naming the way out.
  const attn::Shape packed = kernelcases::kAttention[1];
  AttnCase c(packed, packed.seed(3));
  bool refused = false;
  try {
    cuda::cudnn_attention_forward(c.params(), nullptr);
  } catch (const std::exception& e) {
    refused = std::string(e.what()).find("--attention native") != std::string::npos;
  }
  ck.expect(refused, "a packed batch (seg_start set) must be refused with a message naming --attention native");
}

void check_cudnn_backward(Checks& ck) {
  for (const attn::Shape& s : kCudnnShapes) {
    const unsigned seed = s.seed(4);
    seed_line("cudnn attention bwd", attn_shape(s), seed);
    AttnCase c(s, seed);
    const cuda::AttentionParams p = c.params();
    cuda::cudnn_attention_forward(p, nullptr);
    cuda::cudnn_attention_backward(p, nullptr);
    LT_GPUCHECK_SYNC();
    c.download_backward();
    compare_attention_backward(ck, c, AttnRule::kCudnn);
  }
}

// Empty when cuDNN loads here, else why not (the checks are then skipped, not failed: cuDNN is
// optional, and --attention native needs none).
std::string cudnn_missing() {
  try {
    std::printf("cuDNN %zu loaded\n", lt::cudnn::library_version());
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}
constexpr void (*kCheckCudnnForward)(Checks&) = check_cudnn_forward;
constexpr void (*kCheckCudnnBackward)(Checks&) = check_cudnn_backward;
#else
std::string cudnn_missing() { return "needs a GPU (the simulator build has no cuDNN)"; }
constexpr void (*kCheckCudnnForward)(Checks&) = nullptr;
constexpr void (*kCheckCudnnBackward)(Checks&) = nullptr;
#endif

// ---- optimizer-side ops (fp32 shards) ----------------------------------------------------------------
std::vector<float> padded(size_t n) { return std::vector<float>(n + kPad, kSentinel); }

// Worst relative error |got - ref| / |ref| (absolute where ref == 0); NaN counts as worst.
double worst_rel(const std::vector<float>& got, const std::vector<float>& ref, size_t n) {
  double w = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double e = ref[i] != 0.f ? std::fabs(static_cast<double>(got[i]) - ref[i]) / std::fabs(static_cast<double>(ref[i]))
                                   : std::fabs(static_cast<double>(got[i]));
    if (!(e <= w)) w = e;
  }
  return w;
}

// AdamW over 5 steps: the CPU op's fp32 operations in its order, none fused (the kernel's __fmul_rn /
// __fadd_rn), so param, m and v equal the CPU op's bit for bit; the worst relative error is printed
// for the record. The bf16 copy equals bf16(master).
void check_adamw(Checks& ck) {
  const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  for (const float wd : {0.0f, 0.1f})
    for (const kernelcases::Elements& c : kernelcases::kAdamw) {
      const size_t n = c.n;
      const unsigned seed = kernelcases::adamw_seed(n, wd > 0);
      seed_line("adamw", format("n=%zu wd=%g", n, wd), seed);
      std::mt19937 rng(seed);
      std::normal_distribution<float> pdist(0.f, 0.5f), gdist(0.f, 1e-2f);
      std::vector<float> param = padded(n), zero = padded(n), grad = padded(n);
      for (size_t i = 0; i < n; ++i) param[i] = pdist(rng), zero[i] = 0.f;
      std::vector<float> rp(param), rm(zero), rv(zero);
      DeviceBuffer<float> d_p(param), d_m(zero), d_v(zero), d_g(grad);
      DeviceBuffer<Bf16> d_bf(std::vector<Bf16>(n + kPad, __float2bfloat16(kSentinel)));
      for (int t = 1; t <= 5; ++t) {
        for (size_t i = 0; i < n; ++i) grad[i] = i % 97 == 5 ? 0.f : gdist(rng);
        d_g.upload(grad);
        cuda::AdamwParams p;
        p.param = d_p.get(), p.m = d_m.get(), p.v = d_v.get(), p.grad = d_g.get(), p.param_bf16 = d_bf.get();
        p.n = n, p.lr = lr, p.beta1 = beta1, p.beta2 = beta2, p.eps = eps, p.weight_decay = wd, p.t = t;
        cuda::adamw_update_cuda(p, nullptr);
        cpu::adamw_update(rp.data(), rm.data(), rv.data(), grad.data(), n, lr, beta1, beta2, eps, wd, t);
      }
      LT_GPUCHECK_SYNC();
      const auto gp = d_p.host(), gm = d_m.host(), gv = d_v.host();
      const auto gb = d_bf.host();
      const double ep = worst_rel(gp, rp, n), em = worst_rel(gm, rm, n), ev = worst_rel(gv, rv, n);
      size_t bf_bad = 0, differ = 0;
      for (size_t i = 0; i < n; ++i) bf_bad += bits(gb[i]) != bits(__float2bfloat16(gp[i]));
      for (size_t i = 0; i < n; ++i)
        differ += std::memcmp(&gp[i], &rp[i], 4) != 0 || std::memcmp(&gm[i], &rm[i], 4) != 0 ||
                  std::memcmp(&gv[i], &rv[i], 4) != 0;
      std::printf("  after t=5: %zu of %zu elements differ from the CPU op (worst relative error param %.3e, m %.3e, "
                  "v %.3e); bf16 copy mismatches %zu\n",
                  differ, n, ep, em, ev, bf_bad);
      ck.expect(differ == 0, format("param/m/v of %zu elements differ from the CPU op's bits", differ));
      ck.expect(bf_bad == 0, "bf16 copy differs from bf16(master)");
      int touched = touched_tail(gp, n) + touched_tail(gm, n) + touched_tail(gv, n);
      for (size_t i = n; i < gb.size(); ++i) touched += __bfloat162float(gb[i]) != kSentinel;
      ck.expect(touched == 0, "written past n");
    }
}

void check_sum_squares(Checks& ck) {
  for (const kernelcases::Elements& c : kernelcases::kSumSquares) {
    const size_t n = c.n;
    const unsigned seed = kernelcases::sum_squares_seed(n);
    seed_line("sum_squares", format("n=%zu", n), seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 3.f);
    std::vector<float> x = padded(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
    const size_t ns = cuda::sum_squares_scratch_doubles(n);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<double> d_scratch(std::vector<double>(ns + kPad, -1.0)), d_out(std::vector<double>{-1.0, -7.0});
    cuda::sum_squares_cuda(d_out.get(), d_x.get(), n, d_scratch.get(), nullptr);
    LT_GPUCHECK_SYNC();
    const auto out1 = d_out.host();
    cuda::sum_squares_cuda(d_out.get(), d_x.get(), n, d_scratch.get(), nullptr);
    LT_GPUCHECK_SYNC();
    const auto out2 = d_out.host();
    const auto scratch = d_scratch.host();
    double ref = 0.0;
    for (size_t i = 0; i < n; ++i) ref += static_cast<double>(x[i]) * x[i];
    const double cpu_sum = cpu::sum_squares(x.data(), n);
    const double rel = ref != 0.0 ? std::fabs(out1[0] - ref) / ref : std::fabs(out1[0]);
    const double rel_cpu = cpu_sum != 0.0 ? std::fabs(out1[0] - cpu_sum) / cpu_sum : std::fabs(out1[0]);
    std::printf("  kernel %.17g ref %.17g: rel %.3e (vs cpu::sum_squares %.3e)\n", out1[0], ref, rel, rel_cpu);
    // Squares of fp32 values are exact in double: any order agrees to ~n 2^-53 relative.
    ck.expect(rel <= 1e-6 && rel_cpu <= 1e-6, "sum beyond relative 1e-6");
    ck.expect(std::memcmp(&out1[0], &out2[0], sizeof(double)) == 0, "two runs differ");
    ck.expect(out1[1] == -7.0, "written past the result");
    bool scratch_ok = true;
    for (size_t k = ns; k < scratch.size(); ++k) scratch_ok &= scratch[k] == -1.0;
    ck.expect(scratch_ok, "scratch written past its size");
  }
}

void check_scale(Checks& ck) {
  for (const kernelcases::Elements& c : kernelcases::kScale) {
    const size_t n = c.n;
    const unsigned seed = kernelcases::scale_seed(n);
    seed_line("scale", format("n=%zu", n), seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 2.f);
    std::vector<float> x = padded(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
    std::vector<float> ref(x);
    DeviceBuffer<float> d_x(x);
    cuda::scale_inplace_cuda(d_x.get(), 0.37f, n, nullptr);
    LT_GPUCHECK_SYNC();
    const auto got = d_x.host();
    cpu::scale_inplace(ref.data(), 0.37f, n);
    ck.expect(std::memcmp(got.data(), ref.data(), n * sizeof(float)) == 0, "differs from the CPU op (must be bitwise)");
    ck.expect(touched_tail(got, n) == 0, "written past n");
  }
}

// LoRA's dropout: the same elements dropped as the CPU's op (one hash, one threshold rule), the
// kept ones scaled in fp32 and rounded once; in place too.
void check_dropout(Checks& ck) {
  for (const kernelcases::Dropout& c : kernelcases::kDropout) {
    const size_t n = c.n;
    const float p = c.p;
    const unsigned seed = c.seed();
    const uint64_t stream = c.stream();
    seed_line("dropout", format("n=%zu p=%g stream=%llu", n, p, static_cast<unsigned long long>(stream)), seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<Bf16> x(n + kPad, __float2bfloat16(kSentinel));
    for (size_t i = 0; i < n; ++i) x[i] = __float2bfloat16(dist(rng));
    DeviceBuffer<Bf16> d_x(x), d_out(std::vector<Bf16>(n + kPad, __float2bfloat16(kSentinel)));
    cuda::dropout_cuda(d_out.get(), d_x.get(), n, p, stream, nullptr);
    cuda::dropout_cuda(d_x.get(), d_x.get(), n, p, stream, nullptr);  // in place
    LT_GPUCHECK_SYNC();
    const auto out = d_out.host(), inplace = d_x.host();
    std::vector<float> x32(n), ref(n);
    for (size_t i = 0; i < n; ++i) x32[i] = __bfloat162float(x[i]);
    cpu::dropout(ref.data(), x32.data(), n, p, stream);
    size_t bad = 0, bad_inplace = 0, dropped = 0;
    for (size_t i = 0; i < n; ++i) {
      bad += bits(out[i]) != bits(__float2bfloat16(ref[i]));
      bad_inplace += bits(inplace[i]) != bits(out[i]);
      dropped += ref[i] == 0.f && x32[i] != 0.f;
    }
    const double share = double(dropped) / double(n);
    std::printf("  %zu of %zu dropped (%.4f, p %.2f)\n", dropped, n, share, static_cast<double>(p));
    ck.expect(bad == 0, format("%zu elements differ from the CPU op rounded to bf16", bad));
    ck.expect(bad_inplace == 0, format("in place: %zu elements differ", bad_inplace));
    ck.expect(touched_tail(out, n) == 0, "written past n");
    if (kernelcases::dropout_share_checked(n))
      ck.expect(std::fabs(share - p) <= kernelcases::dropout_share_tolerance(c),
                format("dropped share %.4f further than 5 standard deviations from p %.2f", share, double(p)));
  }
}

void check_cast(Checks& ck) {
  for (const kernelcases::Elements& c : kernelcases::kCast) {
    const size_t n = c.n;
    const unsigned seed = kernelcases::cast_seed(n);
    seed_line("cast", format("n=%zu", n), seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 5.f);
    std::vector<float> x = padded(n);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
    // Exact ties (1 + 2^-8 rounds down to 1, 1 + 3 * 2^-8 up), specials, the largest float, a denormal.
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0.0f, -0.0f,
                             std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
    for (size_t k = 0; k < sizeof special / sizeof special[0] && k < n; ++k) x[k] = special[k];
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<Bf16> d_out(std::vector<Bf16>(n + kPad, __float2bfloat16(kSentinel)));
    cuda::cast_f32_to_bf16_cuda(d_out.get(), d_x.get(), n, nullptr);
    LT_GPUCHECK_SYNC();
    const auto out = d_out.host();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += bits(out[i]) != bits(__float2bfloat16(x[i]));
    int touched = 0;
    for (size_t i = n; i < out.size(); ++i) touched += __bfloat162float(out[i]) != kSentinel;
    ck.expect(bad == 0, format("%zu elements differ from round-to-nearest-even", bad));
    ck.expect(touched == 0, "written past n");
  }
}

}  // namespace

namespace {
struct CheckEntry {
  const char* name;
  void (*fn)(Checks&);
  bool cudnn = false;  // cuDNN's, not ours: last, and a failure is a SKIP (Checks::end_as_yardstick)
};
const std::vector<CheckEntry>& check_entries() {
  static const std::vector<CheckEntry> kEntries = {
      {"rmsnorm_forward", check_rmsnorm_forward},
      {"rmsnorm_backward", check_rmsnorm_backward},
      {"rope_forward", [](Checks& c) { check_rope(c, true); }},
      {"rope_backward", [](Checks& c) { check_rope(c, false); }},
      {"swiglu_forward", check_swiglu_forward},
      {"swiglu_backward", check_swiglu_backward},
      {"embedding_forward", check_embedding_forward},
      {"embedding_backward", check_embedding_backward},
      {"crossentropy_forward", [](Checks& c) { check_crossentropy(c, true); }},
      {"crossentropy_backward", [](Checks& c) { check_crossentropy(c, false); }},
      {"attention_forward", check_attention_forward},
      {"attention_backward", check_attention_backward},
      {"attention_decode", check_attention_decode},
      {"adamw_update", check_adamw},
      {"sum_squares", check_sum_squares},
      {"scale_inplace", check_scale},
      {"dropout", check_dropout},
      {"cast_f32_to_bf16", check_cast},
      {"cudnn_attention_forward", kCheckCudnnForward, true},
      {"cudnn_attention_backward", kCheckCudnnBackward, true},
  };
  return kEntries;
}
}  // namespace

std::vector<std::string> kernel_check_names() {
  std::vector<std::string> names;
  for (const CheckEntry& e : check_entries()) names.push_back(e.name);
  return names;
}

void run_kernel_checks(Checks& ck, const std::string& after) {
  const auto& entries = check_entries();
  const size_t first = index_after(kernel_check_names(), after, "--after");
  const std::string no_cudnn = cudnn_missing();
  for (size_t i = first; i < entries.size(); ++i) {
    const CheckEntry& e = entries[i];
    if (e.cudnn && (!e.fn || !no_cudnn.empty())) {
      ck.skip(e.name, no_cudnn.empty() ? "needs a GPU" : no_cudnn);
      continue;
    }
    ck.begin(e.name);
    try {
      e.fn(ck);
      e.cudnn ? ck.end_as_yardstick() : ck.end();
    } catch (const std::exception& ex) {
      e.cudnn ? ck.end_as_yardstick(ex.what()) : ck.abort_current(ex.what());
      // A sticky device error (an illegal address) poisons the context: nothing after it can run here.
      const cudaError_t sticky = cudaDeviceSynchronize();
      if (sticky != cudaSuccess)
        throw StickyError(e.name, std::string("sticky CUDA error after ") + e.name + ": " + cudaGetErrorString(sticky));
    }
  }
}

}  // namespace lt::gpucheck
