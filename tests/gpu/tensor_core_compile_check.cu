// nvcc compile check of kernels/tensor_core.cuh: one kernel that uses every wrapper, so that the
// inline PTX is assembled for each architecture (no GPU needed; not part of any CMake target):
//   nvcc -std=c++17 -arch=sm_80 -Ikernels -c tests/gpu/tensor_core_compile_check.cu -o /tmp/tc80.o
//   nvcc -std=c++17 -arch=sm_90 -Ikernels -c tests/gpu/tensor_core_compile_check.cu -o /tmp/tc90.o
// `cuobjdump -sass` of the objects shows the instructions: HMMA.16816.F32.BF16 (mma), LDSM.16.M88.*
// (ldmatrix), LDGSTS (cp.async), LDGDEPBAR / DEPBAR (commit / wait_group).
// The kernel is the simulator test's 64x64x64 tile product (tests/sim/test_tensor_core_sim.cpp)
// plus the wrappers that product does not use.
#include "cuda_compat.cuh"
#include "tensor_core.cuh"

namespace {

constexpr int kT = 64;
constexpr int kSmemStride = kT + 8;

}  // namespace

__global__ void tensor_core_compile_check_kernel(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                                 uint32_t* extra) {
  __shared__ __align__(16) __nv_bfloat16 as[kT * kSmemStride];
  __shared__ __align__(16) __nv_bfloat16 bs[kT * kSmemStride];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int chunk = tid; chunk < kT * 8; chunk += blockDim.x) {
    const int row = chunk / 8, col = (chunk % 8) * 8;
    lt::tc::cp_async_16(&as[row * kSmemStride + col], &a[row * kT + col]);
    lt::tc::cp_async_16_zfill(&bs[row * kSmemStride + col], &b[row * kT + col], 16);
  }
  lt::tc::cp_async_commit();
  lt::tc::cp_async_wait<0>();
  __syncthreads();

  float acc[8][4] = {};
  for (int k0 = 0; k0 < kT; k0 += 16) {
    uint32_t fa[4];
    lt::tc::ldmatrix_x4(fa, &as[(warp * 16 + lane % 16) * kSmemStride + k0 + 8 * (lane / 16)]);
    for (int nt = 0; nt < 8; nt += 2) {
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

  // The remaining wrappers.
  __syncthreads();
  uint32_t r[8];
  lt::tc::ldmatrix_x1(&r[0], &as[(lane % 8) * kSmemStride]);
  lt::tc::ldmatrix_x2(&r[1], &as[(lane % 16) * kSmemStride]);
  lt::tc::ldmatrix_x1_trans(&r[3], &bs[(lane % 8) * kSmemStride]);
  lt::tc::ldmatrix_x2_trans(&r[4], &bs[(lane % 16) * kSmemStride]);
  r[6] = lt::tc::pack_bf16x2(a[tid], b[tid]);
  __syncthreads();
  lt::tc::cp_async_ca<4>(&as[2 * tid], &a[2 * tid]);
  lt::tc::cp_async_ca<8>(&bs[4 * tid], &b[4 * tid]);
  lt::tc::cp_async_commit();
  lt::tc::cp_async_ca<16>(&as[kT * 8 + 8 * tid], &a[8 * tid]);
  lt::tc::cp_async_commit();
  lt::tc::cp_async_wait<1>();
  lt::tc::cp_async_wait<0>();
  __syncthreads();
  r[7] = reinterpret_cast<const uint32_t*>(as)[tid] ^ reinterpret_cast<const uint32_t*>(bs)[tid];
  for (int i = 0; i < 8; ++i) extra[tid * 8 + i] = r[i];
}
