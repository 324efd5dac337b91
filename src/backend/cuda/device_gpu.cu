// The device runtime on a GPU (see device.h): the CUDA runtime for memory and copies, cuBLASLt for
// the matrix products (bf16 A and B, fp32 accumulation; bf16 D for activations, fp32 C = D for the
// += weight gradients). Compiled by nvcc only.
//
// Row-major to cuBLAS column-major: a row-major (r, c) matrix is the column-major (c, r) matrix
// with the same bytes, so each product is computed transposed:
//   out^T (OC,N)  = op_T(w: IC x OC, ld IC) * x^T (IC x N, ld IC)
//   dx^T  (IC,N)  = w^T (IC x OC, ld IC)    * dout^T (OC x N, ld OC)
//   dw^T  (IC,OC) += x^T (IC x N, ld IC)    * op_T(dout^T: OC x N, ld OC)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <type_traits>

#include <mutex>
#include <string>

#include "backend/cuda/device.h"
#include "backend/cuda/dynamic_library.h"
#include "backend/cuda/device_ledger.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

// cuBLASLt is loaded with dlopen the first time a matrix product runs on the GPU, not linked:
// linked, its ~500 MB library was mapped and relocated at every start of llamatrain (+0.1 s,
// +210 MB resident), CPU runs included. The soname first (LD_LIBRARY_PATH, the loader cache),
// then the toolkit's library directory found at configure time.
struct CublasLtApi {
  decltype(&::cublasLtGetStatusString) cublasLtGetStatusString = nullptr;
  decltype(&::cublasLtCreate) cublasLtCreate = nullptr;
  decltype(&::cublasLtMatmulDescCreate) cublasLtMatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmul) cublasLtMatmul = nullptr;
};

const CublasLtApi& lt_api() {
  static const CublasLtApi api = [] {
    std::string tried;
    void* lib = dynlib::open_first({LT_CUBLASLT_SONAME, LT_CUBLASLT_DIR "/" LT_CUBLASLT_SONAME, "libcublasLt.so"}, &tried);
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

bool cuda_ok(cudaError_t e) { return e == cudaSuccess; }
const char* cuda_describe(cudaError_t e) { return cudaGetErrorString(e); }
bool cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
const char* cublas_describe(cublasStatus_t s) { return lt_api().cublasLtGetStatusString(s); }

#define LT_CUDA_CHECK(call) LT_API_CHECK("CUDA", call, cuda_ok, cuda_describe)
#define LT_CUBLAS_CHECK(call) LT_API_CHECK("cuBLASLt", call, cublas_ok, cublas_describe)

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's recommended size on Hopper

// One cuBLASLt handle and workspace per process (one process per GPU). The workspace comes from
// device_alloc so that device_memory_stats() counts it.
struct Blas {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  Blas() {
    LT_CUBLAS_CHECK(lt_api().cublasLtCreate(&handle));
    workspace = device_alloc(kWorkspaceBytes);
  }
};
Blas& blas() {
  static Blas b;
  return b;
}

// Owners of the cuBLASLt descriptors of one call.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc(cublasOperation_t ta, cublasOperation_t tb) {
    LT_CUBLAS_CHECK(lt_api().cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CUBLAS_CHECK(lt_api().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CUBLAS_CHECK(lt_api().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  }
  ~MatmulDesc() { lt_api().cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, int rows, int cols, int ld) {
    LT_CUBLAS_CHECK(lt_api().cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  }
  ~Layout() { lt_api().cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() {
    LT_CUBLAS_CHECK(lt_api().cublasLtMatmulPreferenceCreate(&p));
    const size_t ws = kWorkspaceBytes;
    LT_CUBLAS_CHECK(lt_api().cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  }
  ~Preference() { lt_api().cublasLtMatmulPreferenceDestroy(p); }
};

// D (m,n) = alpha op(A) op(B) + beta C, column-major; C and D share storage and type.
void lt_matmul(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, int lda,
               const void* B, int ldb, float beta, void* D, cudaDataType_t d_type, int ldd, cudaStream_t stream) {
  Blas& b = blas();
  MatmulDesc desc(ta, tb);
  Layout la(CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda);
  Layout lb(CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb);
  Layout ld(d_type, m, n, ldd);
  Preference pref;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  LT_CUBLAS_CHECK(lt_api().cublasLtMatmulAlgoGetHeuristic(b.handle, desc.d, la.l, lb.l, ld.l, ld.l, pref.p, 1, &result, &found));
  if (found == 0) fail(strcat("cuBLASLt has no algorithm for a ", m, "x", n, "x", k, " bf16 product"));
  const float alpha = 1.f;
  LT_CUBLAS_CHECK(lt_api().cublasLtMatmul(b.handle, desc.d, &alpha, A, la.l, B, lb.l, &beta, D, ld.l, D, ld.l, &result.algo,
                                 b.workspace, kWorkspaceBytes, stream));
}

}  // namespace

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
  // The driver's used bytes right after an allocation: a lower bound of its high-water mark (frees
  // and the libraries' own allocations are not sampled), one cheap query per allocation.
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) device_ledger().on_driver_used(total_b - free_b);
  return p;
}
void device_free(void* p) noexcept {
  if (!p) return;
  device_ledger().on_free(p);
  cudaFree(p);
}
DeviceMemoryStats device_memory_stats() { return device_ledger().stats(); }
void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) LT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) LT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void device_memset(void* p, int value, size_t bytes) {
  if (bytes) LT_CUDA_CHECK(cudaMemset(p, value, bytes));
}
void device_synchronize() { LT_CUDA_CHECK(cudaDeviceSynchronize()); }
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
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
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
void stream_synchronize(cudaStream_t s) { LT_CUDA_CHECK(cudaStreamSynchronize(s)); }

void matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int N, int IC, int OC,
                    cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  lt_matmul(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, x, IC, 0.f, out, CUDA_R_16BF, OC, stream);
}

void matmul_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* x,
                     const __nv_bfloat16* w, int N, int IC, int OC, cudaStream_t stream) {
  if (N <= 0 || IC <= 0 || OC <= 0) return;
  if (dx) lt_matmul(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, OC, 0.f, dx, CUDA_R_16BF, IC, stream);
  lt_matmul(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, x, IC, dout, OC, 1.f, dw, CUDA_R_32F, IC, stream);
}

LT_CUDA_NAMESPACE_END
