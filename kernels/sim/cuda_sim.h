// A CUDA execution simulator in host C++: the header a kernel source (`kernels/*.cu`) sees when it
// is compiled by g++ instead of nvcc (see kernels/cuda_compat.cuh, which selects it when
// __CUDACC__ is not defined). DESIGN.md, "Testing without a GPU", item 2.
//
// Execution model:
// * A launch runs its blocks one after another on the calling OS thread. The threads of a block
//   are cooperative fibers (a few lines of assembly on x86-64, ucontext elsewhere) switched only at
//   barriers, so between two barriers a thread runs alone: plain loads/stores are race-free and
//   atomics need no hardware support. The fibers run in rounds, each fiber once per round in the
//   round's order; a fiber that waits switches straight to the next one that can run, and fibers
//   whose barrier has not completed are passed over.
// * threadIdx/blockIdx/blockDim/gridDim are thread_local variables set before a fiber is switched
//   to, so every fiber sees its own indices.
// * __syncthreads() is a block barrier: a fiber arrives and yields until every thread of the block
//   arrived at the same barrier (the same source line). A thread that returns while others wait, or
//   a barrier reached after a thread returned, or threads waiting at different barriers, is
//   barrier divergence: the kernel stops with both places named (undefined on the device).
// * Threads run between barriers in an order set by the schedule (set_schedule, or the environment
//   variable LT_SIM_SCHEDULE=forward|reverse|random:SEED): forward by thread index, reverse, or a
//   new seeded permutation at every barrier. A kernel whose result changes with the order reads
//   what another thread writes without a barrier in between (a race); CI runs the kernel tests
//   under several orders.
// * A launch is an operation on its stream (stream_sim.h): run at once by default; with queued
//   streams (the cuda-sim device runtime) held until a synchronisation point and run in a seeded
//   order across streams (LT_SIM_STREAM_ORDER=forward|reverse|random:SEED) that honours event
//   waits, so a missing cudaStreamWaitEvent changes the result, and a host read of memory that
//   work on another stream still writes is reported.
// * A warp shuffle is a barrier over the lanes in its mask: write own value into the buffer of the
//   barrier's generation (two, alternating), wait for the warp, read the partner's value; the
//   buffer is written again only two warp operations later, after every lane has read it. This
//   gives the lock-step result of the hardware for any shuffle pattern.
// * `__shared__ T a[n];` inside a kernel becomes `static thread_local T a[n];` (the macro below):
//   one copy per OS thread, shared by the fibers of the running block. Blocks of one OS thread
//   run one after another, so this is exactly "one copy per block". Like real shared memory it is
//   not re-initialised between blocks. `__shared__` at namespace scope is not supported.
// * Dynamic shared memory (`extern __shared__`) cannot be spelled this way, so kernels declare it
//   with LT_DYNAMIC_SMEM(T, name) (kernels/cuda_compat.cuh), which here yields a pointer to a
//   per-launch buffer of the size given at launch, 16-byte aligned.
// * A barrier that can never complete (divergent __syncthreads, a shuffle mask naming an exited
//   or missing lane) aborts with a message instead of hanging.
// * In the checked build (the kernel tests), every load and store of the kernels goes through the
//   race detector (race_sim.h): per 2-byte granule, which thread wrote and read it in which barrier
//   interval; a conflicting access of another thread, or a read of shared memory the block has not
//   written, stops the kernel with both threads and source lines.
#pragma once
#if defined(__CUDACC__)
#error "cuda_sim.h is the host simulator; nvcc builds use the CUDA runtime"
#endif

#include <cuda_bf16.h>  // __nv_bfloat16 on the host; also brings dim3, uint3, cudaStream_t

// Standard headers that spell __attribute__((__noinline__)) must come before the macro below
// redefines __noinline__; including them here makes later includes no-ops.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// crt/host_defines.h (pulled in by cuda_bf16.h) maps these to attributes g++ ignores or rejects.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#undef __noinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// Function-static thread_local: see the header comment.
#define __shared__ static thread_local

namespace lt::sim {

constexpr int kWarpSize = 32;

// The indices of the running fiber (set before a fiber is switched to).
extern thread_local uint3 thread_idx;
extern thread_local uint3 block_idx;
extern thread_local dim3 block_dim;
extern thread_local dim3 grid_dim;

// Runs entry(ctx) as every thread of every block of the grid; returns when all have finished.
// `kernel` identifies the kernel (for its dynamic shared memory opt-in, set_max_dynamic_smem).
// The launch is checked against the limits of sm_80 and sm_90 first (see kLimits in cuda_sim.cpp).
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem_bytes, void (*entry)(void*), void* ctx);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): launches of
// `kernel` may use up to `bytes` of dynamic shared memory (above the default 48 KiB, up to the
// opt-in maximum).
void set_max_dynamic_smem(const void* kernel, size_t bytes);

// The order in which the threads of a block run between barriers.
enum class Order { kForward, kReverse, kRandom };
struct Schedule {
  Order order = Order::kForward;
  uint64_t seed = 0;  // kRandom: permutations drawn from this seed, the launch and the block
};
// "forward", "reverse" or "random:SEED" (random alone: seed 1); throws std::invalid_argument.
Schedule parse_schedule(const char* text);
void set_schedule(Schedule s);
// The schedule in force: set_schedule's, else LT_SIM_SCHEDULE's, else forward.
Schedule current_schedule();

// Large index ranges: only the first `first` and the last `last` blocks of every launch run (by
// linear block index, x fastest), so a kernel can be launched on tensors beyond 2^31 elements held
// in reserved, mostly untouched memory, and its index arithmetic checked where it matters most, at
// the end. (0, 0), the default: every block runs.
void set_block_subset(uint64_t first, uint64_t last);

// Fault injection for the tests that prove the race detection: the __syncthreads() at `line` of a
// file whose path ends with `file` does nothing (file empty: none is skipped).
void skip_barrier(const char* file, int line);
// Every __syncthreads() site executed since the process started, as "file:line" (path as compiled).
std::vector<std::pair<std::string, int>> barrier_sites();

void syncthreads(const char* file, int line);

// The running block's dynamic shared memory.
unsigned char* dynamic_smem();

void syncwarp(unsigned mask);
// Lock-step exchange: every lane in mask publishes `value`; returns the value of lane `src_lane`
// (a lane index within the warp).
uint64_t warp_exchange(unsigned mask, uint64_t value, int src_lane);
// Lane index of the running thread within its warp (threads are numbered x-fastest).
int lane_id();

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>,
                "shuffles move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

template <class Kernel, class Tuple>
struct LaunchContext {
  Kernel kernel;
  Tuple args;
};

template <class Kernel, class Tuple>
void launch_entry(void* ctx) {
  auto* c = static_cast<LaunchContext<Kernel, Tuple>*>(ctx);
  std::apply(c->kernel, c->args);  // each fiber gets the arguments by value, as on the device
}

}  // namespace lt::sim

// CUDA's built-in variables. The macros keep kernel code unchanged while the storage lives in
// lt::sim (defining a thread_local named threadIdx at global scope would clash with nothing, but
// macros also stop a kernel from taking their address by accident).
#define threadIdx (static_cast<const uint3&>(::lt::sim::thread_idx))
#define blockIdx (static_cast<const uint3&>(::lt::sim::block_idx))
#define blockDim (static_cast<const dim3&>(::lt::sim::block_dim))
#define gridDim (static_cast<const dim3&>(::lt::sim::grid_dim))
constexpr int warpSize = lt::sim::kWarpSize;

// A macro, so that every barrier knows its source line (divergence reports, fault injection).
#define __syncthreads() ::lt::sim::syncthreads(__FILE__, __LINE__)
inline void __syncwarp(unsigned mask = 0xffffffffu) { lt::sim::syncwarp(mask); }

// Shuffles with the semantics of the CUDA C++ Programming Guide ("Warp Shuffle Functions"):
// width splits the warp into segments; a source outside the caller's segment returns the
// caller's own value (down: beyond the segment end; xor: a later segment).
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  const int lane = lt::sim::lane_id();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return lt::sim::from_bits<T>(lt::sim::warp_exchange(mask, lt::sim::to_bits(var), src));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = lt::sim::lane_id();
  const int in_segment = (lane & (width - 1)) + static_cast<int>(delta);
  const int src = in_segment < width ? lane + static_cast<int>(delta) : lane;
  return lt::sim::from_bits<T>(lt::sim::warp_exchange(mask, lt::sim::to_bits(var), src));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = lt::sim::lane_id();
  const int in_segment = (lane & (width - 1)) - static_cast<int>(delta);
  const int src = in_segment >= 0 ? lane - static_cast<int>(delta) : lane;
  return lt::sim::from_bits<T>(lt::sim::warp_exchange(mask, lt::sim::to_bits(var), src));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int lane = lt::sim::lane_id();
  const int partner = lane ^ lane_mask;
  const int src = (partner / width) > (lane / width) ? lane : partner;
  return lt::sim::from_bits<T>(lt::sim::warp_exchange(mask, lt::sim::to_bits(var), src));
}

// Atomics. Fibers of a block never run concurrently, and blocks of a launch run on one OS thread,
// but the builtins keep them correct if blocks are ever spread over OS threads.
inline int atomicAdd(int* address, int val) { return __atomic_fetch_add(address, val, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* address, unsigned val) {
  return __atomic_fetch_add(address, val, __ATOMIC_RELAXED);
}
inline float atomicAdd(float* address, float val) {
  auto* bits = reinterpret_cast<uint32_t*>(address);
  uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    const float sum = lt::sim::from_bits<float>(old) + val;
    uint32_t desired;
    std::memcpy(&desired, &sum, sizeof desired);
    if (__atomic_compare_exchange_n(bits, &old, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return lt::sim::from_bits<float>(old);
  }
}
inline int atomicMax(int* address, int val) {
  int old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (old < val && !__atomic_compare_exchange_n(address, &old, val, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

// Host versions of the device math intrinsics the kernels use. The fast-math ones (__expf,
// __fdividef) are approximations on the device; the host computes them exactly, which is within
// their documented error bounds.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
// Rounded products and sums that the device never contracts into an FMA; the simulator is built
// without FMA instructions, so plain arithmetic is the same.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
// sin(pi x) and cos(pi x), CUDA's sincospif (1 ulp): here through double, whose product with pi
// and libm's functions are exact to well under a float ulp for the arguments the kernels pass.
inline void sincospif(float x, float* s, float* c) {
  const double a = 3.14159265358979323846 * static_cast<double>(x);
  *s = static_cast<float>(std::sin(a));
  *c = static_cast<float>(std::cos(a));
}
template <class T>
inline T __ldg(const T* p) { return *p; }

namespace lt::sim {

// Queues a launch on its stream (stream_sim.h; runs it at once in immediate mode).
void enqueue_kernel(cudaStream_t stream, dim3 grid, dim3 block, std::function<void()> run);

// The simulator side of kernels/cuda_compat.cuh's launch_kernel: converts the arguments to the
// kernel's parameter types once (as the <<<>>> syntax does) and queues the grid on the stream.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  using Tuple = std::tuple<std::decay_t<Params>...>;
  using Context = LaunchContext<void (*)(Params...), Tuple>;
  auto ctx = std::make_shared<Context>(Context{kernel, Tuple(std::forward<Args>(args)...)});
  enqueue_kernel(stream, grid, block, [ctx, grid, block, smem] {
    run_grid(reinterpret_cast<const void*>(ctx->kernel), grid, block, smem,
             &launch_entry<void (*)(Params...), Tuple>, ctx.get());
  });
}

}  // namespace lt::sim

namespace lt::sim {

// ---- warp-collective instructions (tensor_core_sim.cpp) ------------------------------------------
// A .sync.aligned instruction of the whole warp (mma.sync, ldmatrix): every one of the 32 lanes
// publishes `bytes` bytes at `mine`; after all arrived, each receives all 32 lanes' bytes in lane
// order at `all_lanes` (32 * bytes). Built like warp_exchange (write, warp barrier, copy, warp
// barrier). `instruction` names it in messages and must be the same text in every lane: a lane
// missing from the block, returned, or at another warp operation (a different instruction, a
// shuffle) stops the kernel.
void warp_gather(const char* instruction, const void* mine, size_t bytes, void* all_lanes);
// A number that differs for every block run by this OS thread: per-thread state kept outside the
// scheduler (the cp.async queues) is from an earlier block when its recorded serial differs.
uint64_t block_serial();
// Stops the kernel with `what` and the running thread's indices (as the simulator's own checks).
[[noreturn]] void fail_kernel(const char* what);

}  // namespace lt::sim
