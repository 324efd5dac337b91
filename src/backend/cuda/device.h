// The CUDA backend's device runtime: memory, copies and the matrix products, with one
// implementation per build (DESIGN.md, "Testing without a GPU"):
//   device_gpu.cu   CUDA runtime and cuBLASLt (bf16 inputs, fp32 accumulation), on a GPU;
//   device_sim.cpp  host memory and the CPU backend's BLAS on fp32 copies, for --device cuda-sim,
//                   where the kernels run in the simulator.
// Everything here is in the build's inline namespace (lt::gpu::cuda / lt::simulated::cuda, see
// kernels/cuda_compat.cuh), so both builds link into one executable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

// Device memory (256-byte aligned). Failures throw lt::Error naming the size and the cause.
void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;
// What this process holds through device_alloc (the cuBLASLt workspace included; cuDNN's attention
// workspace and NCCL's buffers, allocated by those libraries, are not), to set against the
// planner's prediction. On a GPU also the driver's view, total - free of cudaMemGetInfo, sampled
// after every device_alloc: it adds the CUDA context, the libraries' own buffers and any other
// process on the device, so it is a cross-check, not the same figure.
struct DeviceMemoryStats {
  size_t allocated_bytes = 0;     // now
  size_t peak_bytes = 0;          // high-water mark of allocated_bytes since the process started
  size_t driver_used_peak = 0;    // GPU: the largest total - free seen; 0 in the simulator
};
DeviceMemoryStats device_memory_stats();
// Page-locked host memory (cudaMallocHost; the simulator: aligned host memory), which an
// asynchronous copy needs to be asynchronous. Counted as allocations and frees below.
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* p) noexcept;
// The host-wait rule (issue 34): before the host blocks on the device, the collectives queued so
// far must be waited for by their communicator (DeviceComm::synchronize polls them with
// --comm-timeout and reports a lost peer), never by a plain device wait, which would hang on compute
// that waits for a collective whose peer is gone. This runtime keeps the rule at its one choke
// point: every call here that makes the host wait (copy_to_device, copy_to_host,
// device_synchronize, stream_synchronize, event_synchronize) first runs the hook set here, which
// the model sets to its optimizer's settle (DeviceZero::settle); no other call site needs to
// remember it. The hook's own waits do not run it again. device_free (noexcept) does not run it.
namespace host_wait_detail {
inline std::function<void()>& hook() {
  static std::function<void()> h;
  return h;
}
inline bool& running() {
  static thread_local bool r = false;
  return r;
}
}  // namespace host_wait_detail
// Null: no hook (no collectives in flight can exist).
inline void set_host_wait_hook(std::function<void()> hook) { host_wait_detail::hook() = std::move(hook); }
// The first thing every waiting call does: runs the hook, unless it is running already.
inline void before_host_wait() {
  std::function<void()>& h = host_wait_detail::hook();
  bool& running = host_wait_detail::running();
  if (!h || running) return;
  running = true;
  struct Reset {
    bool& r;
    ~Reset() { r = false; }
  } reset{running};
  h();
}

// cudaMemcpy: the host waits (for the default stream, then the copy) — a host stall.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// cudaMemcpyAsync from pinned host memory on stream s: the host goes on, and must not rewrite src
// before the copy has run (an event recorded after it, event_synchronize).
void copy_to_device_async(void* dst, const void* src_pinned, size_t bytes, cudaStream_t s);
// cudaMemcpyAsync from device to device memory on stream s.
void copy_on_device(void* dst, const void* src, size_t bytes, cudaStream_t s);
void device_memset(void* p, int value, size_t bytes);  // queued on the default stream
// Waits for the device; throws lt::Error with the first asynchronous error, if any.
void device_synchronize();

// What the device runtime did that can stall the host, counted since the process started by both
// builds at the same calls (a step's share is the difference of two readings; train's step records,
// docs/formats.md). Every count is a host stall on a GPU except the asynchronous copies.
struct DeviceCounters {
  uint64_t allocs = 0;           // device_alloc, host_alloc_pinned (cudaMalloc, cudaMallocHost)
  uint64_t frees = 0;            // device_free (cudaFree waits for the whole device), host_free_pinned
  uint64_t device_syncs = 0;     // device_synchronize
  uint64_t stream_syncs = 0;     // stream_synchronize, event_synchronize, DeviceComm::synchronize
  uint64_t h2d_copies = 0;       // host -> device copies, blocking or not
  uint64_t d2h_copies = 0;       // device -> host copies
  uint64_t blocking_copies = 0;  // of those, the ones the host waits for (copy_to_device/copy_to_host)
  uint64_t plans_built = 0;      // cuBLASLt plans (descriptors + heuristic query) built, matmul.cu
};
DeviceCounters device_counters();
// For the parts of the runtime outside the device_* calls (matmul.cu's plan cache, the device
// communicators' synchronize): adds to the process's counts.
void count_plan_built();
void count_stream_sync();
// "CUDA simulator (kernels on the host CPU)" or the current GPU's name.
const char* device_description();
// True in the simulator build.
bool simulated();
// Devices usable now: 0 without a GPU or driver; 1 in the simulator. Throws lt::Error when NVIDIA
// GPUs are present (device nodes) but the CUDA runtime cannot use them (e.g. a driver too old for
// the runtime this binary was built with): that is never a reason to run on the CPU silently.
int device_count();
// What `llamatrain info` says of this backend: devices, driver, runtime, and which copy of each GPU
// library (cuBLASLt, cuDNN, NCCL) would be loaded. Never throws.
std::string runtime_report();
// GPU build only: where cuBLASLt and NCCL are looked for, in order ($LLAMATRAIN_NCCL alone when
// set; the soname, the toolkit's library directory, PyTorch's CUDA wheels).
std::vector<std::string> cublaslt_library_candidates();
std::vector<std::string> nccl_library_candidates();
struct DeviceProperties {
  int sm_count = 0;
  double memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};
// The current device's properties (the simulator: zeros and the host's RAM).
DeviceProperties device_properties();
// The device as a run's start names it: the GPU's name and "(GPU i of n)" for local_rank, or the
// simulator's description.
std::string device_label(int local_rank);
// The dense peak an MFU is measured against, in TFLOP/s, and where it comes from: a GPU's
// datasheet bf16 figure (0 for a GPU not in gpu_spec.h's table), the simulator's host CPU fp32 peak.
double device_peak_tflops(std::string* what);
// The GEMM-rate benchmark's square product: 4096^3, best of 10 on a GPU (about 1 ms on an A100);
// 256^3, best of 3 in the simulator (its CPU BLAS path).
struct GemmBenchmark {
  int n = 0, reps = 0;
  const char* what = "";  // e.g. "bf16 4096^3 cuBLASLt"
};
GemmBenchmark gemm_benchmark();
// Makes GPU local_rank % device_count() current for this process (one process per GPU).
void select_device(int local_rank);

// Streams for overlapping the gradient collectives with the backward pass. Compute runs on the
// default stream (nullptr); collectives on a second one. stream_wait makes `waiter` wait for the
// work queued on `producer` so far (an event in between), without blocking the host. The
// simulator queues work per stream and runs it at synchronisation points in a seeded order across
// streams (kernels/sim/stream_sim.h), so a missing stream_wait shows there as well.
cudaStream_t stream_create();  // non-blocking: no implicit synchronisation with the default stream
void stream_destroy(cudaStream_t s) noexcept;
void stream_wait(cudaStream_t waiter, cudaStream_t producer);
void stream_synchronize(cudaStream_t s);
// Events, for ordering copies against compute across streams (cudaEvent_t on a GPU, the
// simulator's event otherwise). event_record queues the event on s; stream_wait_event makes s wait
// for its latest record; event_synchronize makes the host wait for it (at once if never recorded).
using DeviceEvent = void*;
DeviceEvent event_create();
void event_destroy(DeviceEvent e) noexcept;
void event_record(DeviceEvent e, cudaStream_t s);
void stream_wait_event(cudaStream_t s, DeviceEvent e);
void event_synchronize(DeviceEvent e);

// An owning device array of n elements of T that only grows: resize() to a size within the
// capacity reuses the allocation (no cudaMalloc/cudaFree, each a host stall, in a steady-state
// step), a larger one replaces it. resize() does not keep the contents.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { device_free(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void resize(size_t n) {
    if (n > cap_) {
      device_free(p_);
      p_ = nullptr;
      n_ = cap_ = 0;
      p_ = static_cast<T*>(device_alloc(n * sizeof(T)));
      cap_ = n;
    }
    n_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t capacity() const { return cap_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};

// Matrix products in the convention of lt::cpu::matmul_* (row-major, PyTorch Linear without bias),
// bf16 storage, fp32 accumulation:
//   forward   out (N,OC) = x (N,IC) w^T            (=, rounded to bf16)
//   backward  dx (N,IC) = dout (N,OC) w (OC,IC)     (=, skipped when dx is null)
//             dw (OC,IC) += dout^T x               (fp32, +=; skipped when dw is null: a frozen base)
void matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int N, int IC, int OC,
                    cudaStream_t stream);
void matmul_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* x,
                     const __nv_bfloat16* w, int N, int IC, int OC, cudaStream_t stream);
// forward with an fp32 output (=): decoding's logits, which sampling compares (bf16 would tie
// logits 0.4% apart).
void matmul_forward_f32(float* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int N, int IC, int OC,
                        cudaStream_t stream);

// n fp32 host values rounded to bf16 (nearest even) into device memory at dst: the working copies
// of weights made from the host's (a blocking copy).
inline void copy_to_device_bf16(__nv_bfloat16* dst, const float* src, size_t n) {
  std::vector<__nv_bfloat16> bf(n);
  for (size_t i = 0; i < n; ++i) bf[i] = __float2bfloat16(src[i]);
  copy_to_device(dst, bf.data(), n * sizeof(__nv_bfloat16));
}

LT_CUDA_NAMESPACE_END
