// The simulator's emulation of the tensor-core and async-copy instructions that
// kernels/tensor_core.cuh wraps (mma.sync m16n8k16 bf16, ldmatrix, cp.async). Kernels never call
// these directly: tensor_core.cuh calls them when it is compiled by g++ instead of nvcc.
//
// What the emulation holds a kernel to (the strictest reading of the PTX ISA):
// * mma and ldmatrix are .sync.aligned: every lane of the warp executes the same instruction. All
//   32 lanes must exist and be live, and must be at this same instruction, or the simulator stops
//   the kernel with a message (warp_gather in cuda_sim.h).
// * mma: each lane's D is computed from the A and B fragments of all 32 lanes, placed by the PTX
//   ISA's fragment layout, so a kernel that loads a fragment in the wrong layout gets a wrong
//   product. The products of bf16 inputs are exact in fp32; they are added to C in fp32 in the
//   fixed order k = 0..15 (the hardware's order and internal precision are unspecified).
// * ldmatrix: the row addresses used (lanes 0-7, 0-15 or 0-31 for x1/x2/x4) must be 16-byte
//   aligned; every lane receives its elements as the PTX ISA distributes them.
// * cp.async: a copy is queued by the issuing thread and only performed when a cp.async.wait_group
//   of that thread retires its group. A read of the destination before that wait sees the old
//   bytes, as the device may. Source and destination must be aligned to the copy size; the
//   source and the destination must not change between the cp.async and the wait that performs
//   it (a race on the device). For the race detector the destination is written both at the issue
//   and at the wait: the device may land the copy at any time in between. Copies not yet committed, or still pending when the thread
//   returns, are never performed.
#pragma once
#if defined(__CUDACC__)
#error "tensor_core_sim.h is the host simulator; nvcc builds use the inline PTX in tensor_core.cuh"
#endif

#include <cstddef>
#include <cstdint>

namespace lt::sim::tc {

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c (layouts: kernels/tensor_core.cuh).
void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);

// ldmatrix.sync.aligned.m8n8.x{n_matrices}{.trans}.shared.b16 r, [row_address].
void ldmatrix(uint32_t* r, int n_matrices, bool trans, const void* row_address);

// cp.async.{ca,cg}.shared.global [dst], [src], bytes, src_bytes: `bytes` (4, 8 or 16) copied,
// of which the last bytes - src_bytes are zeros instead of source bytes.
void cp_async(void* dst, const void* src, int bytes, int src_bytes, const char* instruction);
// cp.async.commit_group.
void cp_async_commit();
// cp.async.wait_group n (n = 0: cp.async.wait_all after a commit).
void cp_async_wait(int n);

}  // namespace lt::sim::tc
