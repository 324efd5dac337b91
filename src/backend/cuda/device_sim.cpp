// The device runtime of --device cuda-sim (see device.h): device memory is host memory, kept in the
// ledger so that the simulator's cuBLASLt (cublaslt_sim.cpp, behind matmul.cu) can check that its
// operands are device memory. Compiled only for the simulator build.
#include <unistd.h>

#include <new>

#include "backend/cuda/device.h"
#include "backend/cuda/device_ledger.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

constexpr std::align_val_t kAlign{256};

}  // namespace

void* device_alloc(size_t bytes) {
  void* p = ::operator new(bytes > 0 ? bytes : 1, kAlign, std::nothrow);
  if (!p) fail(strcat("cuda-sim: cannot allocate ", bytes, " bytes of (simulated) device memory"));
  device_ledger().on_alloc(p, bytes);
  return p;
}
void device_free(void* p) noexcept {
  if (!p) return;
  device_ledger().on_free(p);
  ::operator delete(p, kAlign);
}
DeviceMemoryStats device_memory_stats() { return device_ledger().stats(); }
void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void device_memset(void* p, int value, size_t bytes) {
  if (bytes) std::memset(p, value, bytes);
}
void device_synchronize() {}
const char* device_description() { return "CUDA simulator (kernels on the host CPU)"; }
bool simulated() { return true; }
DeviceProperties device_properties() {
  DeviceProperties p;
  p.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  return p;
}
int device_count() { return 1; }
std::string runtime_report() { return ""; }
void select_device(int) {}
cudaStream_t stream_create() { return nullptr; }
void stream_destroy(cudaStream_t) noexcept {}
void stream_wait(cudaStream_t, cudaStream_t) {}
void stream_synchronize(cudaStream_t) {}

LT_CUDA_NAMESPACE_END
