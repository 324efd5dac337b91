// The device runtime of --device cuda-sim (see device.h): device memory is host memory, and the
// matrix products run on the CPU backend's BLAS over fp32 copies of the bf16 operands, rounded back
// to bf16 like a GPU GEMM's epilogue. Compiled only for the simulator build.
#include <unistd.h>

#include <new>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_ledger.h"
#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

constexpr std::align_val_t kAlign{256};

std::vector<float> to_f32(const __nv_bfloat16* x, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = __bfloat162float(x[i]);
  return v;
}

void to_bf16(__nv_bfloat16* out, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
}

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
void select_device(int) {}
cudaStream_t stream_create() { return nullptr; }
void stream_destroy(cudaStream_t) noexcept {}
void stream_wait(cudaStream_t, cudaStream_t) {}
void stream_synchronize(cudaStream_t) {}

void matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int N, int IC, int OC,
                    cudaStream_t) {
  std::vector<float> out32(size_t(N) * OC);
  const auto x32 = to_f32(x, size_t(N) * IC), w32 = to_f32(w, size_t(OC) * IC);
  cpu::matmul_forward(out32.data(), x32.data(), w32.data(), N, IC, OC);
  to_bf16(out, out32);
}

void matmul_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* x,
                     const __nv_bfloat16* w, int N, int IC, int OC, cudaStream_t) {
  const auto dout32 = to_f32(dout, size_t(N) * OC), x32 = to_f32(x, size_t(N) * IC);
  const auto w32 = to_f32(w, size_t(OC) * IC);
  std::vector<float> dx32(dx ? size_t(N) * IC : 0);
  cpu::matmul_backward(dx ? dx32.data() : nullptr, dw, dout32.data(), x32.data(), w32.data(), N, IC, OC);
  if (dx) to_bf16(dx, dx32);
}

LT_CUDA_NAMESPACE_END
