// Attention test cases shared by the CUDA-core (test_attention_sim.cpp) and tensor-core
// (test_attention_tc_sim.cpp) kernel tests: padded head tensors whose padding holds a sentinel,
// the shapes, the packed-example layouts, seeded inputs, and the views the CPU reference takes.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attention.cuh"
#include "sim_test_util.h"

namespace lt::simtest::attention {

using lt::cuda::AttentionHeads;
using lt::cuda::AttentionKernel;
using lt::cuda::AttentionParams;

// A padded (rows, NH, hd) bf16 buffer: head stride hd + head_pad, token stride NH * head stride + kPad
// (head_pad and kPad multiples of 8: the kernels need 16-byte aligned heads); padding holds the
// sentinel. Attention tensors are views of NH' <= NH heads starting at head h0, so q, k and v can
// live in one fused (rows, H + 2 KVH, hd) buffer as the qkv projection writes them.
struct Heads {
  int rows, NH, hd;
  int64_t head_stride, token_stride;
  std::vector<__nv_bfloat16> data;
  Heads(int r, int nh, int d, int head_pad)
      : rows(r), NH(nh), hd(d), head_stride(d + head_pad), token_stride(nh * (d + head_pad) + kPad),
        data(static_cast<size_t>(r) * (nh * (d + head_pad) + kPad) + kPad, __float2bfloat16(kSentinel)) {}
  int64_t index(int r, int h, int c) const { return r * token_stride + h * head_stride + c; }
  float get(int r, int h, int c) const { return __bfloat162float(data[index(r, h, c)]); }
  void set(int r, int h, int c, float v) { data[index(r, h, c)] = __float2bfloat16(v); }
  int touched_padding() const {
    std::vector<char> inside(data.size(), 0);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < hd; ++c) inside[index(r, h, c)] = 1;
    int bad = 0;
    for (size_t i = 0; i < data.size(); ++i)
      if (!inside[i] && __bfloat162float(data[i]) != kSentinel) ++bad;
    return bad;
  }
  AttentionHeads<__nv_bfloat16> view(int h0) { return {data.data() + h0 * head_stride, token_stride, head_stride}; }
  AttentionHeads<const __nv_bfloat16> cview(int h0) const {
    return {data.data() + h0 * head_stride, token_stride, head_stride};
  }
};

// A view of nh heads of a Heads buffer starting at head h0.
struct View {
  Heads* buf;
  int h0, nh;
  float get(int r, int h, int c) const { return buf->get(r, h0 + h, c); }
  // Dense (rows, nh, hd) copy for the CPU op.
  template <class T>
  std::vector<T> dense() const {
    std::vector<T> v(static_cast<size_t>(buf->rows) * nh * buf->hd);
    for (int r = 0; r < buf->rows; ++r)
      for (int h = 0; h < nh; ++h)
        for (int c = 0; c < buf->hd; ++c) v[(static_cast<size_t>(r) * nh + h) * buf->hd + c] = get(r, h, c);
    return v;
  }
};

enum class Seg { kNone, kPacked, kOdd };

struct Shape {
  int B, T, H, KVH, hd;
  Seg seg;
  bool fused;    // q, k, v views of one (B*T, H + 2 KVH, hd) buffer (and dq, dk, dv of another)
  int head_pad;  // extra elements between heads of separate tensors
  float qk_std;  // std of q and k: larger means peakier softmax rows
};

// Tile sizes in attention.cu: 32 (hd 16, 32), 64/32 (hd 64, 128). T values are not multiples of
// them; packed rows put an example start at t = 13 (mid-tile) and more at random places.
inline const Shape kShapes[] = {
    {2, 37, 2, 2, 16, Seg::kNone, false, 0, 1.f},     // group 1
    {1, 70, 4, 2, 32, Seg::kPacked, false, 8, 1.f},   // group 2, three query tiles
    {2, 50, 4, 1, 16, Seg::kOdd, false, 0, 2.f},      // group 4; rows 32..49 (a whole tile) empty
    {1, 100, 2, 1, 64, Seg::kPacked, false, 8, 1.f},  // group 2
    {2, 65, 2, 2, 64, Seg::kNone, true, 0, 1.5f},     // fused qkv, T = tile + 1
    {1, 77, 4, 1, 128, Seg::kPacked, true, 0, 1.f},   // group 4, fused
    {1, 45, 2, 2, 128, Seg::kOdd, false, 8, 3.f},     // large scores, odd seg_start values
    {3, 20, 4, 2, 32, Seg::kPacked, true, 0, 1.f},    // B = 3, one tile
    {1, 1, 2, 1, 32, Seg::kNone, false, 0, 1.f},      // T = 1
    {2, 200, 4, 2, 16, Seg::kPacked, false, 0, 1.5f}, // many tiles and examples per row
    {1, 160, 2, 1, 128, Seg::kPacked, true, 0, 1.f},  // five key tiles per late query tile
    {1, 130, 4, 4, 64, Seg::kOdd, false, 8, 2.f},     // group 1, half a query tile of empty rows
};

inline unsigned seed_for(const Shape& s, unsigned salt) {
  return 1000003u * s.T + 7919u * s.H + 131u * s.KVH + 17u * s.hd + 3u * static_cast<unsigned>(s.seg) + 101u * s.B +
         salt;
}

// seg_start per (b, t). kPacked: examples start at 0, 13 and random later places (lengths 5..T/2).
// kOdd: packed, plus values the CPU op clamps: rows 32..63 empty (seg_start > t), a few more empty
// rows, and a few negative ones (clamped to 0).
inline std::vector<int32_t> make_seg(const Shape& s, std::mt19937& rng) {
  std::vector<int32_t> seg;
  if (s.seg == Seg::kNone) return seg;
  seg.resize(static_cast<size_t>(s.B) * s.T);
  std::uniform_int_distribution<int> len(5, s.T / 2 > 5 ? s.T / 2 : 5);
  for (int b = 0; b < s.B; ++b) {
    int start = 0, next = s.T > 13 ? 13 : s.T;
    for (int t = 0; t < s.T; ++t) {
      if (t == next) start = t, next = t + len(rng);
      seg[static_cast<size_t>(b) * s.T + t] = start;
    }
    if (s.seg == Seg::kOdd) {
      std::uniform_int_distribution<int> pick(0, s.T - 1);
      for (int t = 32; t < 64 && t < s.T; ++t) seg[static_cast<size_t>(b) * s.T + t] = t + 1 + (t % 3);
      for (int n = 0; n < 3; ++n) {
        const int t = pick(rng);
        seg[static_cast<size_t>(b) * s.T + t] = t + 2;
      }
      for (int n = 0; n < 3; ++n) seg[static_cast<size_t>(b) * s.T + pick(rng)] = -7;
    }
  }
  return seg;
}

// Inputs of one case and the buffers the kernels write.
struct Case {
  Shape s;
  std::vector<int32_t> seg;
  Heads qkv_buf, k_buf, v_buf;  // q (and k, v when fused) / k / v
  View q, k, v;
  Heads out, dout;
  Heads dqkv_buf, dk_buf, dv_buf;
  View dq, dk, dv;
  std::vector<float> lse, dsum;  // (B,H,T) + kPad sentinels
  AttentionKernel kernel = AttentionKernel::kAuto;  // which kernels params() asks for

  explicit Case(const Shape& sh)
      : s(sh),
        qkv_buf(sh.B * sh.T, sh.fused ? sh.H + 2 * sh.KVH : sh.H, sh.hd, sh.head_pad),
        k_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        v_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        q{&qkv_buf, 0, sh.H},
        k{sh.fused ? &qkv_buf : &k_buf, sh.fused ? sh.H : 0, sh.KVH},
        v{sh.fused ? &qkv_buf : &v_buf, sh.fused ? sh.H + sh.KVH : 0, sh.KVH},
        out(sh.B * sh.T, sh.H, sh.hd, sh.head_pad),
        dout(sh.B * sh.T, sh.H, sh.hd, sh.head_pad),
        dqkv_buf(sh.B * sh.T, sh.fused ? sh.H + 2 * sh.KVH : sh.H, sh.hd, sh.head_pad),
        dk_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        dv_buf(sh.fused ? 0 : sh.B * sh.T, sh.KVH, sh.hd, sh.head_pad),
        dq{&dqkv_buf, 0, sh.H},
        dk{sh.fused ? &dqkv_buf : &dk_buf, sh.fused ? sh.H : 0, sh.KVH},
        dv{sh.fused ? &dqkv_buf : &dv_buf, sh.fused ? sh.H + sh.KVH : 0, sh.KVH},
        lse(static_cast<size_t>(sh.B) * sh.H * sh.T + kPad, kSentinel),
        dsum(lse.size(), kSentinel) {}

  AttentionParams params() {
    AttentionParams p;
    p.out = out.view(0), p.lse = lse.data();
    p.q = q.buf->cview(q.h0), p.k = k.buf->cview(k.h0), p.v = v.buf->cview(v.h0);
    p.seg_start = seg.empty() ? nullptr : seg.data();
    p.dout = dout.cview(0);
    p.dq = dq.buf->view(dq.h0), p.dk = dk.buf->view(dk.h0), p.dv = dv.buf->view(dv.h0);
    p.dsum = dsum.data();
    p.B = s.B, p.T = s.T, p.H = s.H, p.KVH = s.KVH, p.hd = s.hd;
    p.kernel = kernel;
    return p;
  }
  int rows() const { return s.B * s.T; }
  const int32_t* seg_ptr() const { return seg.empty() ? nullptr : seg.data(); }
};

inline void fill(const View& x, int rows, float std, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, std);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < x.nh; ++h)
      for (int c = 0; c < x.buf->hd; ++c) x.buf->set(r, x.h0 + h, c, dist(rng));
}

inline void make_inputs(Case& k, unsigned seed) {
  std::mt19937 rng(seed);
  k.seg = make_seg(k.s, rng);
  fill(k.q, k.rows(), k.s.qk_std, rng);
  fill(k.k, k.rows(), k.s.qk_std, rng);
  fill(k.v, k.rows(), 1.f, rng);
  fill(View{&k.dout, 0, k.s.H}, k.rows(), 1.f, rng);
}

inline void print_case(const char* what, const Shape& s, unsigned seed) {
  static const char* kSeg[] = {"none", "packed", "odd"};
  std::printf("[attention %s] B=%d T=%d H=%d KVH=%d hd=%d seg=%s fused=%d head_pad=%d qk_std=%g seed=%u\n", what, s.B,
              s.T, s.H, s.KVH, s.hd, kSeg[static_cast<int>(s.seg)], s.fused, s.head_pad, s.qk_std, seed);
}


}  // namespace lt::simtest::attention
