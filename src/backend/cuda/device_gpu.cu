// The device runtime on a GPU (see device.h): the CUDA runtime for memory, copies and streams, and
// the real cuBLASLt behind cublaslt_api() for the matrix products of matmul.cu. Compiled by nvcc only.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/device.h"
#include "runtime/dynamic_library.h"
#include "backend/cuda/cudnn_library.h"
#include "backend/cuda/device_counters.h"
#include "backend/cuda/device_ledger.h"
#include "llamatrain/error.h"
#include "llamatrain/gpu_presence.h"
#include "llamatrain/gpu_spec.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

bool cuda_ok(cudaError_t e) { return e == cudaSuccess; }
const char* cuda_describe(cudaError_t e) { return cudaGetErrorString(e); }
#define LT_CUDA_CHECK(call) LT_API_CHECK("CUDA", call, cuda_ok, cuda_describe)

}  // namespace

// cuBLASLt is loaded with dlopen the first time a matrix product runs on the GPU, not linked:
// linked, its ~500 MB library was mapped and relocated at every start of llamatrain (+0.1 s,
// +210 MB resident), CPU runs included. The soname first (LD_LIBRARY_PATH, the loader cache),
// then the toolkit's library directory found at configure time.
std::vector<std::string> cublaslt_library_candidates() {
  // CUDA 12 wheels keep cuBLAS in nvidia/cublas/lib, CUDA 13 wheels in nvidia/cu13/lib.
  return dynlib::with_python_wheels({LT_CUBLASLT_SONAME, LT_CUBLASLT_DIR "/" LT_CUBLASLT_SONAME, "libcublasLt.so"},
                                    {"cublas", "cu13"}, LT_CUBLASLT_SONAME);
}

std::vector<std::string> nccl_library_candidates() {
  const char* env = std::getenv("LLAMATRAIN_NCCL");
  if (env && *env) return {env};
  return dynlib::with_python_wheels({"libnccl.so.2", LT_NCCL_DIR "/libnccl.so.2", "libnccl.so"}, {"nccl", "cu13"},
                                    "libnccl.so.2");
}

const CublasLtApi& cublaslt_api() {
  static const CublasLtApi api = [] {
    std::string tried;
    void* lib = dynlib::open_first(cublaslt_library_candidates(), &tried);
    if (!lib) fail(strcat("--device cuda needs cuBLASLt (part of the CUDA toolkit), which could not be loaded:", tried));
    CublasLtApi a;
    auto load = [&](auto& fn, const char* name) { dynlib::load_symbol(lib, fn, name, "cuBLASLt"); };
    load(a.cublasLtGetStatusString, "cublasLtGetStatusString");
    load(a.cublasLtCreate, "cublasLtCreate");
    load(a.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate");
    load(a.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    load(a.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy");
    load(a.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    load(a.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    load(a.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    load(a.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    load(a.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    load(a.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    load(a.cublasLtMatmul, "cublasLtMatmul");
    return a;
  }();
  return api;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes > 0 ? bytes : 1);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const DeviceMemoryStats s = device_ledger().stats();
    fail(strcat("cannot allocate ", bytes, " bytes of GPU memory: ", cudaGetErrorString(e), " (this process holds ",
                s.allocated_bytes, " bytes through device_alloc; the device has ", free_b, " of ", total_b, " free)"));
  }
  device_ledger().on_alloc(p, bytes);
  ++device_counts().allocs;
  // The driver's used bytes right after an allocation: a lower bound of its high-water mark (frees
  // and the libraries' own allocations are not sampled), one cheap query per allocation.
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) device_ledger().on_driver_used(total_b - free_b);
  return p;
}
void device_free(void* p) noexcept {
  if (!p) return;
  ++device_counts().frees;
  device_ledger().on_free(p);
  cudaFree(p);
}
DeviceMemoryStats device_memory_stats() { return device_ledger().stats(); }
void* host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes > 0 ? bytes : 1);
  if (e != cudaSuccess) fail(strcat("cannot allocate ", bytes, " bytes of pinned host memory: ", cudaGetErrorString(e)));
  ++device_counts().allocs;
  return p;
}
void host_free_pinned(void* p) noexcept {
  if (!p) return;
  ++device_counts().frees;
  cudaFreeHost(p);
}
void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  before_host_wait();
  ++device_counts().h2d_copies;
  ++device_counts().blocking_copies;
  LT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  before_host_wait();
  ++device_counts().d2h_copies;
  ++device_counts().blocking_copies;
  LT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void copy_to_device_async(void* dst, const void* src_pinned, size_t bytes, cudaStream_t s) {
  if (!bytes) return;
  ++device_counts().h2d_copies;
  LT_CUDA_CHECK(cudaMemcpyAsync(dst, src_pinned, bytes, cudaMemcpyHostToDevice, s));
}
void copy_on_device(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes) LT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
}
void device_memset(void* p, int value, size_t bytes) {
  if (bytes) LT_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, nullptr));
}
void device_synchronize() {
  before_host_wait();
  ++device_counts().device_syncs;
  LT_CUDA_CHECK(cudaDeviceSynchronize());
}
DeviceCounters device_counters() { return device_counts().read(); }
void count_plan_built() { ++device_counts().plans_built; }
void count_stream_sync() { ++device_counts().stream_syncs; }
const char* device_description() {
  static std::string name;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      name = prop.name;
    else
      name = "unknown CUDA device";
  });
  return name.c_str();
}

bool simulated() { return false; }
std::string device_label(int local_rank) {
  return strcat(device_description(), " (GPU ", local_rank % device_count(), " of ", device_count(), ")");
}
double device_peak_tflops(std::string* what) {
  const GpuSpec* spec = gpu_spec_for_device(device_description(), device_properties().memory_bytes);
  if (!spec) return 0;
  *what = strcat(spec->name, " datasheet dense bf16");
  return spec->bf16_tflops;
}
GemmBenchmark gemm_benchmark() { return {4096, 10, "bf16 4096^3 cuBLASLt"}; }
DeviceProperties device_properties() {
  int dev = 0;
  cudaDeviceProp prop{};
  LT_CUDA_CHECK(cudaGetDevice(&dev));
  LT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  DeviceProperties p;
  p.sm_count = prop.multiProcessorCount;
  p.memory_bytes = double(prop.totalGlobalMem);
  p.cc_major = prop.major;
  p.cc_minor = prop.minor;
  return p;
}
namespace {

// The device count, or the runtime's error text in *error.
int count_devices(std::string* error) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n;
  cudaGetLastError();  // clear the sticky error
  // No GPU at all (no device nodes) is the ordinary CPU machine; device nodes with a runtime that
  // cannot use them (a driver older than this runtime needs) is an error.
  if (e != cudaErrorNoDevice) {
    const GpuPresence presence = detect_gpu_presence();
    if (!presence.device_nodes.empty()) {
      int driver = 0;
      cudaDriverGetVersion(&driver);
      cudaGetLastError();
      *error = unusable_gpu_message(presence, CUDART_VERSION, driver,
                                    strcat("cudaGetDeviceCount: ", cudaGetErrorString(e)));
    }
  }
  return 0;
}

}  // namespace

int device_count() {
  std::string error;
  const int n = count_devices(&error);
  if (!error.empty()) fail(error);
  return n;
}

std::string runtime_report() {
  std::string error;
  const int n = count_devices(&error);
  const GpuPresence presence = detect_gpu_presence();
  int driver = 0;
  cudaDriverGetVersion(&driver);
  cudaGetLastError();
  std::string r = strcat("cuda:         CUDA runtime ", CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10, ", ");
  r += driver > 0 ? strcat("driver for CUDA ", driver / 1000, ".", driver % 1000 / 10) : std::string("no usable driver");
  if (!presence.driver_version.empty()) r += " (NVIDIA driver " + presence.driver_version + ")";
  r += strcat(", ", presence.device_nodes.size(), " device node(s), ", n, " usable GPU(s)\n");
  if (!error.empty()) r += "cuda error:   " + error + "\n";
  r += "cuBLASLt:     " + dynlib::describe_first(cublaslt_library_candidates()) + "\n";
  r += "cuDNN:        " + dynlib::describe_first(cudnn::library_candidates()) + "\n";
  r += "NCCL:         " + dynlib::describe_first(nccl_library_candidates()) + "\n";
  return r;
}
void select_device(int local_rank) {
  const int n = device_count();
  if (n == 0) fail("no CUDA device is visible to this process");
  LT_CUDA_CHECK(cudaSetDevice(local_rank % n));
}

cudaStream_t stream_create() {
  cudaStream_t s = nullptr;
  LT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void stream_destroy(cudaStream_t s) noexcept {
  if (s) cudaStreamDestroy(s);
}
void stream_wait(cudaStream_t waiter, cudaStream_t producer) {
  // An event per call: recorded, waited on, and released (the wait keeps what it needs), so
  // calls never share an event whose re-recording could move a pending wait.
  cudaEvent_t e = nullptr;
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  LT_CUDA_CHECK(cudaEventRecord(e, producer));
  LT_CUDA_CHECK(cudaStreamWaitEvent(waiter, e, 0));
  LT_CUDA_CHECK(cudaEventDestroy(e));
}
void stream_synchronize(cudaStream_t s) {
  before_host_wait();
  ++device_counts().stream_syncs;
  LT_CUDA_CHECK(cudaStreamSynchronize(s));
}
DeviceEvent event_create() {
  cudaEvent_t e = nullptr;
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void event_destroy(DeviceEvent e) noexcept {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}
void event_record(DeviceEvent e, cudaStream_t s) { LT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), s)); }
void stream_wait_event(cudaStream_t s, DeviceEvent e) {
  LT_CUDA_CHECK(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(e), 0));
}
void event_synchronize(DeviceEvent e) {
  before_host_wait();
  ++device_counts().stream_syncs;
  LT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
}

LT_CUDA_NAMESPACE_END
