// The simulator's race detector (race_sim.cpp): what the scheduler tells it about the running
// thread, and the notes the instruction emulations (tensor_core_sim.cpp) give it for the memory
// they touch on a thread's behalf. Kernels never include this header.
//
// How it sees memory: the checked build compiles the kernels (and the simulator tests, so their
// own kernels too) with GCC's -fsanitize=thread instrumentation, which turns every load and store
// into a call (__tsan_read4(addr), __tsan_write8(addr), ...). Those calls are answered by
// race_sim.cpp, not by ThreadSanitizer's runtime (which is never linked): it keeps a shadow record
// per 2-byte granule of the last write and the last read(s), with the thread, its block, the
// block's barrier interval and the warp's __syncwarp count. An access conflicts with a record of
// another thread of the same block in the same barrier interval (for two lanes of one warp: with
// no __syncwarp between them either), or with a record of another block of the same launch on
// global memory; two atomics never conflict. A read of shared memory that the block has not
// written is a read of the poison every block starts with. Each is reported with the kernel, the
// address and what it is (static or dynamic shared memory, global memory), both threads and both
// source lines, and stops the kernel.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lt::sim {

// The running simulated thread, as the scheduler (cuda_sim.cpp) maintains it.
struct RunningThread {
  bool in_kernel = false;
  const void* kernel = nullptr;
  uint32_t launch = 0;                 // launch number + 1
  uint32_t block = 0;                  // linear block index in the grid
  uint32_t tid = 0;                    // linear thread index in the block
  const uint64_t* interval = nullptr;  // the block's barrier generation
  const uint64_t* warp_fence = nullptr;  // completed __syncwarp()s of the thread's warp
  const unsigned char* smem = nullptr;   // dynamic shared memory of the block
  size_t smem_bytes = 0;
  uintptr_t stack_lo = 0, stack_hi = 0;  // the fiber's stack (private, never checked)
};
extern thread_local RunningThread t_running;

// Race detection is on when the checked (instrumented) code is linked in, unless turned off here
// (or by LT_SIM_RACES=0) for a test that races on purpose.
bool race_detection_available();
void set_race_detection(bool on);

namespace race {
// Called by the scheduler when a launch starts: shadow records of earlier launches can never
// conflict, so the shadow may be dropped to bound its memory.
void launch_started();
// Called when a block's barrier interval ends (by the thread that completes the __syncthreads(),
// and when the block ends): reports a read of shared memory the block had not written.
void interval_ended();
// Accesses performed by an emulated instruction on behalf of the running thread; `pc` is the
// kernel's code address that issued it (__builtin_return_address(0) of the emulation's entry).
void note_read(const void* addr, size_t bytes, const void* pc);
void note_write(const void* addr, size_t bytes, const void* pc);
}  // namespace race

}  // namespace lt::sim
