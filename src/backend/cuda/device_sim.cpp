// The device runtime of --device cuda-sim (see device.h): device memory is host memory, kept in the
// ledger so that the simulator's cuBLASLt (cublaslt_sim.cpp, behind matmul.cu) can check that its
// operands are device memory. Compiled only for the simulator build.
//
// Streams are the simulator's (kernels/sim/stream_sim.h), switched to queued mode at the first
// allocation: work runs at the synchronisation points below, in the order LT_SIM_STREAM_ORDER
// picks. Every function keeps the CUDA runtime call's semantics in device_gpu.cu:
//   copy_to_device/copy_to_host  cudaMemcpy: waits for the default stream (not for other streams;
//                                work still queued there on the same bytes is reported), then copies;
//   copy_to_device_async         cudaMemcpyAsync: queued on its stream, reads the (pinned) host
//                                source when it runs, so a source rewritten too early shows;
//   device_memset                cudaMemset: queued on the default stream;
//   device_free                  cudaFree: synchronises the device first;
//   stream_wait                  an event recorded on `producer`, waited for by `waiter`.
// Each call adds to the counts of device_counters() as its twin does (device_counters.h).
// None of them synchronises more than its CUDA twin, so host stalls a step would have on a GPU are
// the ones it has here.
#include <omp.h>
#include <unistd.h>

#include <new>

#include "backend/cuda/device.h"
#include "backend/cuda/device_counters.h"
#include "backend/cuda/device_ledger.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "sim/stream_sim.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

constexpr std::align_val_t kAlign{256};

}  // namespace

void* device_alloc(size_t bytes) {
  sim::set_queued_streams(true);
  void* p = ::operator new(bytes > 0 ? bytes : 1, kAlign, std::nothrow);
  if (!p) fail(strcat("cuda-sim: cannot allocate ", bytes, " bytes of (simulated) device memory"));
  device_ledger().on_alloc(p, bytes);
  ++device_counts().allocs;
  return p;
}
void device_free(void* p) noexcept {
  if (!p) return;
  ++device_counts().frees;
  sim::device_synchronize();
  device_ledger().on_free(p);
  ::operator delete(p, kAlign);
}
DeviceMemoryStats device_memory_stats() { return device_ledger().stats(); }
void* host_alloc_pinned(size_t bytes) {
  void* p = ::operator new(bytes > 0 ? bytes : 1, kAlign, std::nothrow);
  if (!p) fail(strcat("cuda-sim: cannot allocate ", bytes, " bytes of (simulated) pinned host memory"));
  ++device_counts().allocs;
  return p;
}
void host_free_pinned(void* p) noexcept {
  if (!p) return;
  ++device_counts().frees;
  ::operator delete(p, kAlign);
}
void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  before_host_wait();
  ++device_counts().h2d_copies;
  ++device_counts().blocking_copies;
  sim::host_write(dst, bytes, "copy_to_device");
  std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  before_host_wait();
  ++device_counts().d2h_copies;
  ++device_counts().blocking_copies;
  sim::host_read(src, bytes, "copy_to_host");
  std::memcpy(dst, src, bytes);
}
void copy_to_device_async(void* dst, const void* src_pinned, size_t bytes, cudaStream_t s) {
  if (!bytes) return;
  ++device_counts().h2d_copies;
  sim::memcpy_async(dst, src_pinned, bytes, s);
}
void copy_on_device(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes) sim::memcpy_async(dst, src, bytes, s);
}
void device_memset(void* p, int value, size_t bytes) {
  if (bytes) sim::memset_async(p, value, bytes, nullptr);
}
void device_synchronize() {
  before_host_wait();
  ++device_counts().device_syncs;
  sim::device_synchronize();
}
DeviceCounters device_counters() { return device_counts().read(); }
void count_plan_built() { ++device_counts().plans_built; }
void count_stream_sync() { ++device_counts().stream_syncs; }
const char* device_description() { return "CUDA simulator (kernels on the host CPU)"; }
bool simulated() { return true; }
std::string device_label(int) { return device_description(); }
double device_peak_tflops(std::string* what) {
  const double peak = host_cpu_peak_tflops(omp_get_max_threads(), what);
  *what = "simulator on the host CPU: " + *what;
  return peak;
}
GemmBenchmark gemm_benchmark() { return {256, 3, "bf16 256^3 CPU BLAS (simulator)"}; }
DeviceProperties device_properties() {
  DeviceProperties p;
  p.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  return p;
}
int device_count() { return 1; }
std::string runtime_report() { return ""; }
void select_device(int) {}
cudaStream_t stream_create() { return sim::stream_create(); }
void stream_destroy(cudaStream_t s) noexcept { sim::stream_destroy(s); }
void stream_wait(cudaStream_t waiter, cudaStream_t producer) {
  sim::Event* e = sim::event_create();
  sim::event_record(e, producer);
  sim::stream_wait_event(waiter, e);
  sim::event_destroy(e);
}
void stream_synchronize(cudaStream_t s) {
  before_host_wait();
  ++device_counts().stream_syncs;
  sim::stream_synchronize(s);
}
DeviceEvent event_create() { return sim::event_create(); }
void event_destroy(DeviceEvent e) noexcept {
  if (e) sim::event_destroy(static_cast<sim::Event*>(e));
}
void event_record(DeviceEvent e, cudaStream_t s) { sim::event_record(static_cast<sim::Event*>(e), s); }
void stream_wait_event(cudaStream_t s, DeviceEvent e) { sim::stream_wait_event(s, static_cast<sim::Event*>(e)); }
void event_synchronize(DeviceEvent e) {
  before_host_wait();
  ++device_counts().stream_syncs;
  sim::event_synchronize(static_cast<sim::Event*>(e));
}

LT_CUDA_NAMESPACE_END
