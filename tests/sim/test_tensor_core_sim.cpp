// Tests of the tensor-core and async-copy wrappers (kernels/tensor_core.cuh) as the simulator
// emulates them (kernels/sim/tensor_core_sim.cpp): mma.sync m16n8k16 bf16 against an fp64 product
// with fragments loaded by the PTX ISA layout; ldmatrix x1/x2/x4 (.trans) against the documented
// distribution; a 64x64x64 tile product built from cp.async + ldmatrix + mma; cp.async's group
// semantics, its stale reads before the wait, and its alignment faults. Each numeric test prints
// its seed and worst element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_compat.cuh"
#include "tensor_core.cuh"

namespace {

using lt::tc::pack_bf16x2;

constexpr double kU32 = 1.0 / (1 << 24);  // fp32 unit roundoff

std::vector<__nv_bfloat16> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(u(rng));
  return v;
}

// ---- mma with fragments loaded straight from global memory ---------------------------------------
// The loads follow the register table of tensor_core.cuh (the simulator places elements by the
// PTX ISA's per-element formulas; the two must agree). swap_a / swap_b: two lanes that load each
// other's A (B) fragment, on purpose, or -1.
__global__ void mma_kernel(float* d /*(16, 8)*/, const __nv_bfloat16* a /*(16, 16)*/, const __nv_bfloat16* b /*(16, 8) k-major*/,
                           const float* c /*(16, 8)*/, int swap_a0, int swap_a1, int swap_b0, int swap_b1) {
  const int lane = threadIdx.x % 32;
  auto partner = [&](int x, int y) { return lane == x ? y : (lane == y ? x : lane); };
  const int la = partner(swap_a0, swap_a1), lb = partner(swap_b0, swap_b1);
  int g = la >> 2, t = la % 4;
  uint32_t fa[4];
  fa[0] = pack_bf16x2(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]);
  fa[1] = pack_bf16x2(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]);
  fa[2] = pack_bf16x2(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]);
  fa[3] = pack_bf16x2(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]);
  g = lb >> 2, t = lb % 4;
  uint32_t fb[2];
  fb[0] = pack_bf16x2(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
  fb[1] = pack_bf16x2(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
  g = lane >> 2, t = lane % 4;
  float fc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  float fd[4];
  lt::tc::mma_m16n8k16_bf16_f32(fd, fa, fb, fc);
  d[g * 8 + 2 * t] = fd[0];
  d[g * 8 + 2 * t + 1] = fd[1];
  d[(g + 8) * 8 + 2 * t] = fd[2];
  d[(g + 8) * 8 + 2 * t + 1] = fd[3];
}

struct MmaCase {
  std::vector<__nv_bfloat16> a, b;
  std::vector<float> c;
  std::vector<double> ref, bound;  // C + A B in fp64; the fp32 error bound per element
};

MmaCase make_mma_case(std::mt19937& rng, float scale) {
  MmaCase m;
  m.a = random_bf16(16 * 16, rng, scale);
  m.b = random_bf16(16 * 8, rng, scale);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  m.c.resize(16 * 8);
  for (auto& x : m.c) x = u(rng);
  m.ref.resize(16 * 8);
  m.bound.resize(16 * 8);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = m.c[i * 8 + j], mag = std::fabs(m.c[i * 8 + j]);
      for (int k = 0; k < 16; ++k) {
        const double p = double(__bfloat162float(m.a[i * 16 + k])) * __bfloat162float(m.b[k * 8 + j]);
        s += p;
        mag += std::fabs(p);
      }
      m.ref[i * 8 + j] = s;
      // 16 fp32 additions of exact products: |err| <= 16 u (|c| + sum |a b|) (naive summation bound).
      m.bound[i * 8 + j] = 16 * kU32 * mag;
    }
  return m;
}

std::vector<float> run_mma(const MmaCase& m, int sa0 = -1, int sa1 = -1, int sb0 = -1, int sb1 = -1) {
  std::vector<float> d(16 * 8, std::nanf(""));
  lt::launch_kernel(mma_kernel, dim3(1), dim3(32), 0, nullptr, d.data(), m.a.data(), m.b.data(), m.c.data(), sa0,
                    sa1, sb0, sb1);
  return d;
}

TEST(TensorCore, MmaM16n8k16MatchesFp64Product) {
  const unsigned seed = 1616;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  double worst_ratio = 0, worst_err = 0;
  int worst_trial = -1, worst_el = -1;
  for (int trial = 0; trial < 24; ++trial) {
    const float scale = trial % 3 == 0 ? 1.f : (trial % 3 == 1 ? 1e-3f : 300.f);
    const MmaCase m = make_mma_case(rng, scale);
    const std::vector<float> d = run_mma(m);
    for (int e = 0; e < 16 * 8; ++e) {
      ASSERT_TRUE(std::isfinite(d[e])) << "trial " << trial << " element " << e;
      const double err = std::fabs(d[e] - m.ref[e]);
      ASSERT_LE(err, m.bound[e]) << "trial " << trial << " row " << e / 8 << " col " << e % 8 << ": got " << d[e]
                                 << " ref " << m.ref[e];
      if (err / m.bound[e] > worst_ratio) {
        worst_ratio = err / m.bound[e];
        worst_err = err;
        worst_trial = trial;
        worst_el = e;
      }
    }
  }
  std::printf("mma 16x8x16: worst |err| %.3e (%.3f of the fp32 bound 16u sum|ab|) at trial %d (%d,%d)\n", worst_err,
              worst_ratio, worst_trial, worst_el / 8, worst_el % 8);
}

// Swapping the fragments of two lanes must change exactly the D rows (A) or columns (B) those
// fragments feed: the emulation places every register by the layout.
TEST(TensorCore, MmaUsesTheFragmentLayout) {
  const unsigned seed = 1617;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const MmaCase m = make_mma_case(rng, 1.f);
  auto changed = [&](const std::vector<float>& d, int e) { return std::fabs(d[e] - m.ref[e]) > 100 * m.bound[e]; };
  // Lanes 0 (groupID 0, threadID_in_group 0) and 5 (groupID 1, threadID_in_group 1): their A
  // registers hold rows {0, 8} and {1, 9}; every column of those rows changes, nothing else.
  const std::vector<float> da = run_mma(m, 0, 5, -1, -1);
  double worst = 0;
  for (int e = 0; e < 16 * 8; ++e) {
    const int row = e / 8;
    const bool fed = row == 0 || row == 8 || row == 1 || row == 9;
    EXPECT_EQ(changed(da, e), fed) << "A swap: row " << row << " col " << e % 8;
    worst = std::max(worst, std::fabs(da[e] - m.ref[e]));
  }
  std::printf("A fragments of lanes 0 and 5 swapped: largest change %.3e, rows 0,1,8,9 only\n", worst);
  // Lanes 1 (groupID 0) and 6 (groupID 1): their B registers hold columns 0 and 1 of B (rows
  // 2,3,10,11 and 4,5,12,13): columns 0 and 1 of D change in every row.
  const std::vector<float> db = run_mma(m, -1, -1, 1, 6);
  for (int e = 0; e < 16 * 8; ++e) {
    const int col = e % 8;
    EXPECT_EQ(changed(db, e), col == 0 || col == 1) << "B swap: row " << e / 8 << " col " << col;
  }
  // And the unswapped run matches (the comparison itself can pass).
  const std::vector<float> d = run_mma(m);
  for (int e = 0; e < 16 * 8; ++e) EXPECT_FALSE(changed(d, e));
}

// One spot check written out from the PTX ISA's figures rather than a formula: lane 5 is
// groupID 1, threadID_in_group 1, so it holds A(1,2..3), A(9,2..3), A(1,10..11), A(9,10..11),
// B(2..3,1), B(10..11,1) and D(1,2..3), D(9,2..3). With A = B = 0 except at those places, only
// lane 5's D registers see a product.
__global__ void mma_lane5_kernel(float* out /*(32, 4)*/) {
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16 one = __float2bfloat16(1.f), zero = __float2bfloat16(0.f);
  uint32_t a[4], b[2];
  const __nv_bfloat16 v = lane == 5 ? one : zero;
  for (int r = 0; r < 4; ++r) a[r] = pack_bf16x2(v, zero);  // A(1,2), A(9,2), A(1,10), A(9,10) = 1 in lane 5
  b[0] = pack_bf16x2(v, zero);                              // B(2,1) = 1
  b[1] = pack_bf16x2(v, zero);                              // B(10,1) = 1
  const float c[4] = {0, 0, 0, 0};
  float d[4];
  lt::tc::mma_m16n8k16_bf16_f32(d, a, b, c);
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = d[i];
}

TEST(TensorCore, MmaLane5HoldsWhatThePtxFigureSays) {
  std::vector<float> out(32 * 4, -1.f);
  lt::launch_kernel(mma_lane5_kernel, dim3(1), dim3(32), 0, nullptr, out.data());
  // D(1, c) = sum_k A(1,k) B(k,c): A(1,2) B(2,1) + A(1,10) B(10,1) = 2 at c = 1; row 9 likewise.
  // D(1,1) is held by lane 4 (groupID 1, threadID_in_group 0) as d1; D(9,1) as its d3.
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const float want = (lane == 4 && (i == 1 || i == 3)) ? 2.f : 0.f;
      EXPECT_EQ(out[lane * 4 + i], want) << "lane " << lane << " d" << i;
    }
}

// ---- ldmatrix ------------------------------------------------------------------------------------
// Four 8x8 b16 matrices in shared memory with a padded row stride; element (m, r, c) holds the
// code 0x4000 + 64 m + 8 r + c. Lane l points at row l % 8 of matrix `order[l / 8]` (a
// permutation, to show that the lane, not the address, names the matrix); lanes past the x1/x2
// range get a misaligned address, which must be ignored.
constexpr int kLdmStride = 24;  // elements per shared row: 48 bytes, 16-byte aligned rows

__global__ void ldmatrix_kernel(uint32_t* out /*(32, 4)*/, int n, int trans) {
  __shared__ __align__(16) uint16_t tile[4 * 8 * kLdmStride];
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 4 * 8 * kLdmStride; i += 32) {
    const int row = i / kLdmStride, col = i % kLdmStride;  // row = 8 m + r
    tile[i] = col < 8 ? static_cast<uint16_t>(0x4000 + 8 * row + col) : 0xdead;
  }
  __syncwarp();
  const int order[4] = {2, 0, 3, 1};
  const int j = lane / 8;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(&tile[(order[j] * 8 + lane % 8) * kLdmStride]);
  if (j >= n) p += 2;  // unused lanes: misaligned on purpose
  uint32_t r[4] = {0, 0, 0, 0};
  if (!trans) {
    if (n == 1) lt::tc::ldmatrix_x1(r, p);
    if (n == 2) lt::tc::ldmatrix_x2(r, p);
    if (n == 4) lt::tc::ldmatrix_x4(r, p);
  } else {
    if (n == 1) lt::tc::ldmatrix_x1_trans(r, p);
    if (n == 2) lt::tc::ldmatrix_x2_trans(r, p);
    if (n == 4) lt::tc::ldmatrix_x4_trans(r, p);
  }
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

TEST(TensorCore, LdmatrixDistributesAsThePtxIsaSays) {
  const int order[4] = {2, 0, 3, 1};
  for (int trans = 0; trans < 2; ++trans)
    for (int n : {1, 2, 4}) {
      std::vector<uint32_t> out(32 * 4, 0xffffffffu);
      lt::launch_kernel(ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, out.data(), n, trans);
      int checked = 0;
      for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < 4; ++j) {
          const int g = lane >> 2, t = lane % 4, m = order[j];
          // Without .trans the lane holds row groupID, cols 2t, 2t+1; with .trans rows 2t, 2t+1, col groupID.
          const uint32_t lo = trans ? 0x4000 + 64 * m + 8 * (2 * t) + g : 0x4000 + 64 * m + 8 * g + 2 * t;
          const uint32_t hi = trans ? 0x4000 + 64 * m + 8 * (2 * t + 1) + g : 0x4000 + 64 * m + 8 * g + 2 * t + 1;
          const uint32_t want = j < n ? (lo | hi << 16) : 0u;  // registers past x_n stay untouched
          EXPECT_EQ(out[lane * 4 + j], want) << "x" << n << (trans ? ".trans" : "") << " lane " << lane << " r" << j;
          checked += j < n;
        }
      std::printf("ldmatrix x%d%s: %d registers as documented\n", n, trans ? ".trans" : "", checked);
    }
}

// ---- the 64x64x64 product: cp.async -> shared, ldmatrix -> fragments, mma --------------------------
// C (64, 64) fp32 = A (64, 64) bf16 row-major * B (64, 64) bf16 row-major (k, n). Four warps; warp w
// owns rows 16w..16w+15 and all 64 columns (8 n-tiles), looping k in steps of 16.
constexpr int kT = 64;
constexpr int kSmemStride = kT + 8;  // 144-byte rows: 16-byte aligned, and off the bank period

__global__ void tile_gemm_kernel(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b) {
  __shared__ __align__(16) __nv_bfloat16 as[kT * kSmemStride];
  __shared__ __align__(16) __nv_bfloat16 bs[kT * kSmemStride];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // 64 rows x 8 chunks of 16 bytes per matrix; 128 threads copy 4 chunks of each.
  for (int chunk = tid; chunk < kT * 8; chunk += blockDim.x) {
    const int row = chunk / 8, col = (chunk % 8) * 8;
    lt::tc::cp_async_16(&as[row * kSmemStride + col], &a[row * kT + col]);
    lt::tc::cp_async_16(&bs[row * kSmemStride + col], &b[row * kT + col]);
  }
  lt::tc::cp_async_commit();
  lt::tc::cp_async_wait<0>();
  __syncthreads();

  float acc[8][4] = {};
  for (int k0 = 0; k0 < kT; k0 += 16) {
    // A: x4 over the 16x16 block (rows lane % 16, cols k0 + 8 (lane / 16)) is the A fragment.
    uint32_t fa[4];
    lt::tc::ldmatrix_x4(fa, &as[(warp * 16 + lane % 16) * kSmemStride + k0 + 8 * (lane / 16)]);
    for (int nt = 0; nt < 8; nt += 2) {
      // B: x4.trans over k rows k0 + lane % 16, cols 8 nt + 8 (lane / 16): {r0, r1} is the B
      // fragment of n-tile nt, {r2, r3} that of nt + 1.
      uint32_t fb[4];
      lt::tc::ldmatrix_x4_trans(fb, &bs[(k0 + lane % 16) * kSmemStride + 8 * nt + 8 * (lane / 16)]);
      lt::tc::mma_m16n8k16_bf16_f32(acc[nt], fa, &fb[0], acc[nt]);
      lt::tc::mma_m16n8k16_bf16_f32(acc[nt + 1], fa, &fb[2], acc[nt + 1]);
    }
  }
  const int g = lane >> 2, t = lane % 4;
  for (int nt = 0; nt < 8; ++nt) {
    const int row = warp * 16 + g, col = nt * 8 + 2 * t;
    c[row * kT + col] = acc[nt][0];
    c[row * kT + col + 1] = acc[nt][1];
    c[(row + 8) * kT + col] = acc[nt][2];
    c[(row + 8) * kT + col + 1] = acc[nt][3];
  }
}

TEST(TensorCore, TileProduct64x64x64FromCpAsyncLdmatrixMma) {
  const unsigned seed = 1618;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const std::vector<__nv_bfloat16> a = random_bf16(kT * kT, rng, 1.f), b = random_bf16(kT * kT, rng, 1.f);
  std::vector<float> c(kT * kT, std::nanf(""));
  lt::launch_kernel(tile_gemm_kernel, dim3(1), dim3(128), 0, nullptr, c.data(), a.data(), b.data());
  double worst = 0, worst_ratio = 0;
  int wi = -1, wj = -1;
  for (int i = 0; i < kT; ++i)
    for (int j = 0; j < kT; ++j) {
      double s = 0, mag = 0;
      for (int k = 0; k < kT; ++k) {
        const double p = double(__bfloat162float(a[i * kT + k])) * __bfloat162float(b[k * kT + j]);
        s += p;
        mag += std::fabs(p);
      }
      const double bound = kT * kU32 * mag;  // 64 fp32 additions of exact products
      const double err = std::fabs(c[i * kT + j] - s);
      ASSERT_TRUE(std::isfinite(c[i * kT + j])) << i << "," << j;
      ASSERT_LE(err, bound) << "C(" << i << "," << j << "): got " << c[i * kT + j] << " ref " << s;
      if (err / bound > worst_ratio) worst_ratio = err / bound, worst = err, wi = i, wj = j;
    }
  std::printf("64x64x64: worst |err| %.3e (%.3f of the fp32 bound 64u sum|ab|) at (%d,%d)\n", worst, worst_ratio, wi,
              wj);
}

// ---- cp.async semantics ---------------------------------------------------------------------------
// Each of 8 threads copies 16 bytes (4 floats) into dynamic shared memory that it first fills
// with -1, reads its destination before waiting (`before`) and after (`after`).
__global__ void cp_async_read_kernel(float* before /*(32)*/, float* after /*(32)*/, const float* src /*(32)*/,
                                     int wait) {
  LT_DYNAMIC_SMEM(float, buf);
  const int t = threadIdx.x;
  for (int i = 0; i < 4; ++i) buf[4 * t + i] = -1.f;
  lt::tc::cp_async_16(&buf[4 * t], &src[4 * t]);
  lt::tc::cp_async_commit();
  for (int i = 0; i < 4; ++i) before[4 * t + i] = buf[4 * t + i];
  if (wait) lt::tc::cp_async_wait<0>();
  for (int i = 0; i < 4; ++i) after[4 * t + i] = buf[4 * t + i];
}

TEST(TensorCore, CpAsyncDataArrivesAtTheWaitOnly) {
  std::vector<float> src(32), before(32, 0.f), after(32, 0.f);
  for (int i = 0; i < 32; ++i) src[i] = 100.f + i;
  lt::launch_kernel(cp_async_read_kernel, dim3(1), dim3(8), 32 * sizeof(float), nullptr, before.data(),
                    after.data(), src.data(), 1);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(before[i], -1.f) << "a read before cp.async.wait_group must see the old bytes, element " << i;
    EXPECT_EQ(after[i], src[i]) << "element " << i;
  }
  // Without the wait the copy never lands (the strictest legal order), so the kernel's read is stale.
  lt::launch_kernel(cp_async_read_kernel, dim3(1), dim3(8), 32 * sizeof(float), nullptr, before.data(),
                    after.data(), src.data(), 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(after[i], -1.f) << "element " << i;
}

// wait_group N retires all but the newest N committed groups; copies after the last commit are
// in no group; an empty commit is a group. One thread, slots 0..7 of shared memory:
//   group 1: slot 0 (ca 4 bytes) | group 2: slots 2-3 (ca 8 bytes)
//   group 3: empty | uncommitted: slots 4-7 (cg 16, zero-filled after 4 source bytes)
__global__ void cp_async_groups_kernel(float* snap /*(4 snapshots, 8)*/, const float* src /*(8)*/) {
  __shared__ __align__(16) float buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = -1.f;
  lt::tc::cp_async_ca<4>(&buf[0], &src[0]);
  lt::tc::cp_async_commit();
  lt::tc::cp_async_ca<8>(&buf[2], &src[2]);
  lt::tc::cp_async_commit();
  lt::tc::cp_async_commit();
  lt::tc::cp_async_16_zfill(&buf[4], &src[4], 4);
  auto save = [&](int s) {
    for (int i = 0; i < 8; ++i) snap[s * 8 + i] = buf[i];
  };
  lt::tc::cp_async_wait<3>();
  save(0);  // nothing retired
  lt::tc::cp_async_wait<2>();
  save(1);  // group 1
  lt::tc::cp_async_wait<0>();
  save(2);  // groups 2 and 3; not the uncommitted copy
  lt::tc::cp_async_commit();
  lt::tc::cp_async_wait<0>();
  save(3);  // everything
}

TEST(TensorCore, CpAsyncWaitGroupRetiresTheOldestGroups) {
  std::vector<float> src(8), snap(4 * 8, 0.f);
  for (int i = 0; i < 8; ++i) src[i] = 10.f + i;
  lt::launch_kernel(cp_async_groups_kernel, dim3(1), dim3(1), 0, nullptr, snap.data(), src.data());
  const float x = -1.f;
  const float want[4][8] = {{x, x, x, x, x, x, x, x},
                            {10, x, x, x, x, x, x, x},
                            {10, x, 12, 13, x, x, x, x},
                            {10, x, 12, 13, 14, 0, 0, 0}};
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 8; ++i) EXPECT_EQ(snap[s * 8 + i], want[s][i]) << "snapshot " << s << " slot " << i;
}

// ---- faults the simulator must report ---------------------------------------------------------------
__global__ void cp_async_misaligned_kernel(const unsigned char* src, int src_offset, int dst_offset) {
  __shared__ __align__(16) unsigned char buf[64];
  lt::tc::cp_async_16(buf + dst_offset, src + src_offset);
  lt::tc::cp_async_commit();
  lt::tc::cp_async_wait<0>();
}

TEST(TensorCoreDeathTest, MisalignedCpAsync16Aborts) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  alignas(16) static unsigned char src[64] = {};
  EXPECT_DEATH(lt::launch_kernel(cp_async_misaligned_kernel, dim3(1), dim3(1), 0, nullptr, src, 8, 0),
               "cp.async.cg.shared.global 16: global source 0x[0-9a-f]+ is not 16-byte aligned");
  EXPECT_DEATH(lt::launch_kernel(cp_async_misaligned_kernel, dim3(1), dim3(1), 0, nullptr, src, 0, 4),
               "cp.async.cg.shared.global 16: shared destination 0x[0-9a-f]+ is not 16-byte aligned");
}

__global__ void cp_async_source_race_kernel(float* src) {
  __shared__ __align__(16) float buf[4];
  lt::tc::cp_async_16(buf, src);
  lt::tc::cp_async_commit();
  src[0] = 5.f;  // the copy may read either value on the device
  lt::tc::cp_async_wait<0>();
}

TEST(TensorCoreDeathTest, SourceWrittenBeforeTheWaitAborts) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  alignas(16) static float src[4] = {1, 2, 3, 4};
  EXPECT_DEATH(lt::launch_kernel(cp_async_source_race_kernel, dim3(1), dim3(1), 0, nullptr, src),
               "changed between the cp.async and the wait_group");
}

__global__ void ldmatrix_misaligned_kernel() {
  __shared__ __align__(16) uint16_t tile[8 * 16];
  const int lane = threadIdx.x % 32;
  uint32_t r[1];
  // Lane 3's row starts 8 bytes into a 16-byte unit.
  lt::tc::ldmatrix_x1(r, &tile[(lane % 8) * 16 + (lane == 3 ? 4 : 0)]);
}

__global__ void mma_kernel_partial_warp(int skip_lane) {
  if (static_cast<int>(threadIdx.x) == skip_lane) return;
  const uint32_t a[4] = {}, b[2] = {};
  const float c[4] = {};
  float d[4];
  lt::tc::mma_m16n8k16_bf16_f32(d, a, b, c);
}

__global__ void mixed_instructions_kernel() {
  __shared__ __align__(16) uint16_t tile[16 * 8];
  const uint32_t a[4] = {}, b[2] = {};
  const float c[4] = {};
  float d[4];
  uint32_t r[2];
  if (threadIdx.x < 16) {
    lt::tc::mma_m16n8k16_bf16_f32(d, a, b, c);
  } else {
    lt::tc::ldmatrix_x2(r, &tile[(threadIdx.x % 16) * 8]);
  }
}

TEST(TensorCoreDeathTest, WarpInstructionFaultsAreReported) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(lt::launch_kernel(ldmatrix_misaligned_kernel, dim3(1), dim3(32), 0, nullptr),
               "ldmatrix.sync.aligned.m8n8.x1.shared.b16: row address 0x[0-9a-f]+ given by lane 3 is not 16-byte "
               "aligned");
  // A block of 16 threads has no full warp.
  EXPECT_DEATH(lt::launch_kernel(mma_kernel_partial_warp, dim3(1), dim3(16), 0, nullptr, -1),
               "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 needs all 32 lanes of the warp");
  // Lane 7 returned before the mma.
  EXPECT_DEATH(lt::launch_kernel(mma_kernel_partial_warp, dim3(1), dim3(64), 0, nullptr, 7),
               "needs all 32 lanes of the warp: lanes 0xffffffff exist, 0xffffff7f have not returned");
  // Half the warp at mma, half at ldmatrix: .aligned violated.
  EXPECT_DEATH(lt::launch_kernel(mixed_instructions_kernel, dim3(1), dim3(32), 0, nullptr),
               "is .aligned: lane [0-9]+ of the warp is not at the same instruction");
}

}  // namespace
