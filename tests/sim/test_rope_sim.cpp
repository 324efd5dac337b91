// kernels/rope.cu under the CUDA simulator, against the CPU backend (lt::cpu::rope_*) and an fp64
// reference. Inputs are rounded to bf16 first; every reference sees the same rounded values.
// Low-precision rule (STYLE.md): the kernel's worst error against fp64 is at most 2x that of the
// naive bf16 computation (the fp32 CPU result rounded to bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernel_cases.h"
#include "llamatrain/ops_cpu.h"
#include "rope.cuh"
#include "sim_test_util.h"

namespace {

using lt::simtest::bf;
using lt::simtest::kPad;
using lt::simtest::kSentinel;

constexpr float kTheta = 10000.f;

// A padded (rows, H, hd) bf16 tensor: head stride hd + head_pad, token stride H * head stride + kPad;
// every padding element holds the sentinel.
struct Bf16Heads {
  int rows, H, hd;
  int64_t head_stride, token_stride;
  std::vector<__nv_bfloat16> data;
  Bf16Heads(int r, int h, int d, int head_pad)
      : rows(r), H(h), hd(d), head_stride(d + head_pad), token_stride(h * (d + head_pad) + kPad),
        data(r * (h * (d + head_pad) + kPad) + kPad, __float2bfloat16(kSentinel)) {}
  int64_t index(int r, int h, int d) const { return r * token_stride + h * head_stride + d; }
  __nv_bfloat16& at(int r, int h, int d) { return data[index(r, h, d)]; }
  float get(int r, int h, int d) const { return __bfloat162float(data[index(r, h, d)]); }
  int touched_padding() const {
    std::vector<char> inside(data.size(), 0);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < hd; ++d) inside[index(r, h, d)] = 1;
    int bad = 0;
    for (size_t k = 0; k < data.size(); ++k)
      if (!inside[k] && __bfloat162float(data[k]) != kSentinel) ++bad;
    return bad;
  }
  // Contiguous (rows, H, hd) copies for the CPU references.
  template <class T>
  std::vector<T> dense() const {
    std::vector<T> v(static_cast<size_t>(rows) * H * hd);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < hd; ++d) v[(static_cast<size_t>(r) * H + h) * hd + d] = get(r, h, d);
    return v;
  }
};

Bf16Heads random_heads(int rows, int H, int hd, int head_pad, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  Bf16Heads m(rows, H, hd, head_pad);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < hd; ++d) m.at(r, h, d) = __float2bfloat16(dist(rng));
  return m;
}

struct ErrorReport {
  double worst = 0.0;
  int row = -1, head = -1, col = -1;
  double got = 0.0, ref = 0.0;
  bool finite = true;
  void add(int r, int h, int c, double g, double rf) {
    if (!std::isfinite(g)) finite = false;
    const double e = std::fabs(g - rf);
    if (e > worst || row < 0) worst = e, row = r, head = h, col = c, got = g, ref = rf;
  }
};

std::string describe(const char* what, const ErrorReport& e) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s worst |err| %.3e at (row %d, head %d, %d): got %.8g ref %.8g", what, e.worst,
                e.row, e.head, e.col, e.got, e.ref);
  return buf;
}

using Case = lt::kernelcases::Rope;
using lt::kernelcases::RopePositions;

// Runs the forward (sign > 0) or backward pass for one case and checks it.
void run_case(const Case& c, int index, bool forward) {
  const unsigned seed = c.seed(index, forward ? 1 : 2);
  const int rows = c.B * c.T;
  std::printf("[rope %s] case %d: B=%d T=%d Hq=%d Hk=%d hd=%d head_pad=%d pos=%d in_place=%d seed=%u\n",
              forward ? "fwd" : "bwd", index, c.B, c.T, c.Hq, c.Hk, c.hd, c.head_pad, static_cast<int>(c.pos),
              c.in_place, seed);
  std::mt19937 rng(seed);
  const Bf16Heads xq = random_heads(rows, c.Hq, c.hd, c.head_pad, rng, 1.5f);
  const Bf16Heads xk = random_heads(rows, c.Hk, c.hd, c.head_pad, rng, 1.5f);
  const std::vector<int32_t> pos = lt::kernelcases::rope_positions(c, rng);
  const int32_t* pos_ptr = pos.empty() ? nullptr : pos.data();

  Bf16Heads outq(rows, c.Hq, c.hd, c.head_pad), outk(rows, c.Hk, c.hd, c.head_pad);
  Bf16Heads inq = xq, ink = xk;  // the kernel's inputs (overwritten when in place)
  Bf16Heads& dq = c.in_place ? inq : outq;
  Bf16Heads& dk = c.in_place ? ink : outk;

  lt::cuda::RopeParams p;
  p.q.x = inq.data.data(), p.q.out = dq.data.data(), p.q.H = c.Hq;
  p.q.x_token_stride = inq.token_stride, p.q.x_head_stride = inq.head_stride;
  p.q.out_token_stride = dq.token_stride, p.q.out_head_stride = dq.head_stride;
  if (c.Hk > 0) {
    p.k.x = ink.data.data(), p.k.out = dk.data.data(), p.k.H = c.Hk;
    p.k.x_token_stride = ink.token_stride, p.k.x_head_stride = ink.head_stride;
    p.k.out_token_stride = dk.token_stride, p.k.out_head_stride = dk.head_stride;
  }
  p.pos = pos_ptr;
  p.B = c.B, p.T = c.T, p.hd = c.hd, p.theta = kTheta;
  if (forward)
    lt::cuda::rope_forward_cuda(p, nullptr);
  else
    lt::cuda::rope_backward_cuda(p, nullptr);

  const Bf16Heads* ins[2] = {&xq, &xk};
  const Bf16Heads* outs[2] = {&dq, &dk};
  const char* names[2] = {"q", "k"};
  for (int t = 0; t < 2; ++t) {
    const Bf16Heads& x = *ins[t];
    const Bf16Heads& out = *outs[t];
    const int H = x.H;
    if (H == 0) {
      EXPECT_EQ(out.touched_padding(), 0);
      continue;
    }
    std::vector<float> x32 = x.dense<float>(), out32(x32.size());
    std::vector<double> x64 = x.dense<double>(), out64(x64.size());
    if (forward) {
      lt::cpu::rope_forward(out32.data(), x32.data(), pos_ptr, c.B, c.T, H, c.hd, kTheta);
      lt::cpu::rope_forward(out64.data(), x64.data(), pos_ptr, c.B, c.T, H, c.hd, kTheta);
    } else {
      lt::cpu::rope_backward(out32.data(), x32.data(), pos_ptr, c.B, c.T, H, c.hd, kTheta);
      lt::cpu::rope_backward(out64.data(), x64.data(), pos_ptr, c.B, c.T, H, c.hd, kTheta);
    }
    ErrorReport kernel_err, naive_err, cpu_err;
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < c.hd; ++d) {
          const size_t k = (static_cast<size_t>(r) * H + h) * c.hd + d;
          kernel_err.add(r, h, d, out.get(r, h, d), out64[k]);
          naive_err.add(r, h, d, bf(out32[k]), out64[k]);
          cpu_err.add(r, h, d, out.get(r, h, d), bf(out32[k]));
        }
    std::printf("  %s: %s\n  %s: %s\n  %s: %s\n  %s: kernel/naive ratio %.3f\n", names[t],
                describe("kernel vs fp64", kernel_err).c_str(), names[t],
                describe("naive bf16 vs fp64", naive_err).c_str(), names[t],
                describe("kernel vs cpu fp32 (bf16-rounded)", cpu_err).c_str(), names[t],
                naive_err.worst > 0 ? kernel_err.worst / naive_err.worst : 0.0);
    EXPECT_TRUE(kernel_err.finite) << names[t] << " seed=" << seed;
    EXPECT_LE(kernel_err.worst, 2.0 * naive_err.worst) << names[t] << " " << describe("kernel vs fp64", kernel_err);
    EXPECT_EQ(out.touched_padding(), 0) << names[t] << " seed=" << seed;
    if (!c.in_place) {
      EXPECT_EQ(x.data, (t == 0 ? inq : ink).data) << names[t] << ": input modified";
    }
  }
}

TEST(RopeSim, ForwardMatchesCpuAndFp64) {
  int i = 0;
  for (const Case& c : lt::kernelcases::kRope)
    if (const int index = i++; !c.large) run_case(c, index, true);  // large: the device program's
}

TEST(RopeSim, BackwardMatchesCpuAndFp64) {
  int i = 0;
  for (const Case& c : lt::kernelcases::kRope)
    if (const int index = i++; !c.large) run_case(c, index, false);
}

// Backward undoes forward (the rotation is orthogonal): R^T R x == x up to two bf16 roundings.
TEST(RopeSim, BackwardInvertsForward) {
  const int B = 2, T = 13, H = 3, hd = 16;
  std::mt19937 rng(7);
  std::printf("[rope inverse] B=%d T=%d H=%d hd=%d seed=7\n", B, T, H, hd);
  const Bf16Heads x = random_heads(B * T, H, hd, 0, rng, 1.f);
  Bf16Heads y = x;
  const Case c{B, T, H, 0, hd, 0, RopePositions::kPacked, true};
  std::vector<int32_t> pos = lt::kernelcases::rope_positions(c, rng);
  lt::cuda::RopeParams p;
  p.q.x = y.data.data(), p.q.out = y.data.data(), p.q.H = H;
  p.q.x_token_stride = p.q.out_token_stride = y.token_stride;
  p.q.x_head_stride = p.q.out_head_stride = y.head_stride;
  p.pos = pos.data(), p.B = B, p.T = T, p.hd = hd, p.theta = kTheta;
  lt::cuda::rope_forward_cuda(p, nullptr);
  lt::cuda::rope_backward_cuda(p, nullptr);
  double worst = 0.0;
  for (int r = 0; r < B * T; ++r)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < hd; ++d) {
        const double e = std::fabs(y.get(r, h, d) - x.get(r, h, d));
        worst = std::max(worst, e / std::max(1.0, std::fabs(static_cast<double>(x.get(r, h, d)))));
      }
  std::printf("  worst relative round-trip error %.3e\n", worst);
  EXPECT_LE(worst, 4.0 * 0x1p-8);  // two rotations, each rounded to bf16 (2^-9 relative step)
}

}  // namespace
