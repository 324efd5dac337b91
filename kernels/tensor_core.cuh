// Tensor-core and async-copy instructions, written once: inline PTX under nvcc, the simulator's
// emulation (kernels/sim/tensor_core_sim.h) under g++. Kernels include this after cuda_compat.cuh
// and never write PTX of their own (STYLE.md, "From the PTX ISA and CUTLASS/cute").
//
// Fragment layouts are those of the PTX ISA (9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with
// floating point type", 9.7.14.5.15 "ldmatrix"), in its terms:
//   groupID           = %laneid >> 2
//   threadID_in_group = %laneid % 4
// A .b32 register holding two b16 elements holds the lower-numbered element in its low 16 bits
// (pack_bf16x2 below).
//
// Requirements (checked by the simulator, undefined behaviour on the device):
// * mma and ldmatrix are .sync.aligned: all 32 lanes of the warp execute the same instruction
//   (no lane exited, none in a branch that skips it).
// * ldmatrix row addresses and cp.async addresses are in shared memory (destination) and 16-byte
//   aligned (ldmatrix rows; cp.async: aligned to the copy size).
// * A cp.async's destination must not be read before the cp_async_wait that retires its group.
#pragma once

#include <cstdint>

#include "cuda_compat.cuh"

#if !defined(__CUDACC__)
#include "sim/tensor_core_sim.h"
#endif

namespace lt {
inline namespace LT_CUDA_FLAVOR {
namespace tc {

// Two bf16 as one .b32 fragment register: `lo` (the lower-numbered element) in bits 0-15.
__device__ __forceinline__ uint32_t pack_bf16x2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  const __nv_bfloat16_raw l = lo, h = hi;
  return static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(h.x) << 16);
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 -----------------------------------------
// D (16x8, f32) = A (16x16, bf16, row) * B (16x8, bf16, col) + C (16x8, f32), one warp.
//
// A: a[0..3], each two bf16 elements (a0..a7, low to high):
//   a[0] = {a0, a1}: row groupID,     cols threadID_in_group * 2 + {0, 1}
//   a[1] = {a2, a3}: row groupID + 8, cols threadID_in_group * 2 + {0, 1}
//   a[2] = {a4, a5}: row groupID,     cols threadID_in_group * 2 + {0, 1} + 8
//   a[3] = {a6, a7}: row groupID + 8, cols threadID_in_group * 2 + {0, 1} + 8
// B: b[0..1], each two bf16 elements (b0..b3):
//   b[0] = {b0, b1}: rows (k) threadID_in_group * 2 + {0, 1},     col groupID
//   b[1] = {b2, b3}: rows (k) threadID_in_group * 2 + {0, 1} + 8, col groupID
// C and D: c[0..3] / d[0..3], one f32 each:
//   c0, c1: row groupID,     cols threadID_in_group * 2 + {0, 1}
//   c2, c3: row groupID + 8, cols threadID_in_group * 2 + {0, 1}
// d may alias c. The device's summation order and internal precision are unspecified; the
// simulator adds the (exact) products to c in fp32 in the order k = 0..15.
__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                      const float c[4]) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  ::lt::sim::tc::mma_m16n8k16_bf16_f32(d, a, b, c);
#endif
}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}{,.trans}.shared.b16 -------------------------------------
// Loads 1, 2 or 4 8x8 matrices of b16 from shared memory, one warp. Each lane passes one row
// address (16 bytes = the row's 8 elements, 16-byte aligned): lanes 8j..8j+7 give rows 0..7 of
// matrix j (x1: lanes 0-7 used, x2: lanes 0-15, x4: all 32; the other lanes' addresses are
// ignored). Register r[j] of every lane receives two elements of matrix j:
//   without .trans: row groupID, cols threadID_in_group * 2 + {0, 1}   (low, high)
//   with .trans:    rows threadID_in_group * 2 + {0, 1}, col groupID   (low, high)
// So one x4 of a row-major 16x16 tile whose lanes point at rows (lane % 16), cols 8 * (lane / 16)
// gives exactly the mma A fragment above (matrices: rows 0-7/8-15 x cols 0-7, then cols 8-15);
// .trans of a row-major (k, n) tile gives the B fragment.
#if defined(__CUDACC__)
#define LT_TC_SMEM_ADDR(p) static_cast<uint32_t>(__cvta_generic_to_shared(p))
#endif

__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* smem_row) {
#if defined(__CUDACC__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(LT_TC_SMEM_ADDR(smem_row))
               : "memory");
#else
  ::lt::sim::tc::ldmatrix(r, 1, false, smem_row);
#endif
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* smem_row) {
#if defined(__CUDACC__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(LT_TC_SMEM_ADDR(smem_row))
               : "memory");
#else
  ::lt::sim::tc::ldmatrix(r, 2, false, smem_row);
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem_row) {
#if defined(__CUDACC__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(LT_TC_SMEM_ADDR(smem_row))
               : "memory");
#else
  ::lt::sim::tc::ldmatrix(r, 4, false, smem_row);
#endif
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* smem_row) {
#if defined(__CUDACC__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(LT_TC_SMEM_ADDR(smem_row))
               : "memory");
#else
  ::lt::sim::tc::ldmatrix(r, 1, true, smem_row);
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* smem_row) {
#if defined(__CUDACC__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(LT_TC_SMEM_ADDR(smem_row))
               : "memory");
#else
  ::lt::sim::tc::ldmatrix(r, 2, true, smem_row);
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem_row) {
#if defined(__CUDACC__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(LT_TC_SMEM_ADDR(smem_row))
               : "memory");
#else
  ::lt::sim::tc::ldmatrix(r, 4, true, smem_row);
#endif
}

// ---- cp.async (global -> shared, asynchronous, per thread) --------------------------------------
// A thread's cp.async operations are gathered into groups by cp_async_commit (cp.async.commit_group;
// a commit with no copies makes an empty group, which still counts); cp_async_wait<N>
// (cp.async.wait_group N) waits until at most the N most recently committed groups of this thread
// are pending, so N = 0 waits for all committed ones. Copies issued after the last commit belong
// to no group yet and are not waited for. The data is visible to the issuing thread after the
// wait; other threads of the block see it after a __syncthreads that follows the wait.
//
// cp_async_16: cp.async.cg.shared.global [smem], [gmem], 16 (bypasses L1); both addresses 16-byte
// aligned.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
#if defined(__CUDACC__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(LT_TC_SMEM_ADDR(smem)), "l"(gmem) : "memory");
#else
  ::lt::sim::tc::cp_async(smem, gmem, 16, 16, "cp.async.cg.shared.global 16");
#endif
}
// cp.async.cg.shared.global [smem], [gmem], 16, src_bytes: the first src_bytes (0..16) bytes are
// copied, the rest of the 16 are zero-filled (for tiles at a matrix edge).
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
#if defined(__CUDACC__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(LT_TC_SMEM_ADDR(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#else
  ::lt::sim::tc::cp_async(smem, gmem, 16, src_bytes, "cp.async.cg.shared.global 16 (zfill)");
#endif
}
// cp.async.ca.shared.global [smem], [gmem], kBytes (4, 8 or 16; cached in L1): both addresses
// aligned to kBytes.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
#if defined(__CUDACC__)
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(LT_TC_SMEM_ADDR(smem)), "l"(gmem), "n"(kBytes)
               : "memory");
#else
  ::lt::sim::tc::cp_async(smem, gmem, kBytes, kBytes,
                          kBytes == 4 ? "cp.async.ca.shared.global 4"
                                      : (kBytes == 8 ? "cp.async.ca.shared.global 8" : "cp.async.ca.shared.global 16"));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDACC__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  ::lt::sim::tc::cp_async_commit();
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group takes a non-negative count");
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
  ::lt::sim::tc::cp_async_wait(N);
#endif
}

#if defined(__CUDACC__)
#undef LT_TC_SMEM_ADDR
#endif

}  // namespace tc
}  // inline namespace LT_CUDA_FLAVOR
}  // namespace lt
