// The matrix products of the CUDA backend (device.h) through cuBLASLt: bf16 A and B, fp32
// accumulation; bf16 D for activations, fp32 C = D for the += weight gradients. The same source in
// both builds: under nvcc the descriptors go to the real library, in the simulator build to its
// interpreter (cublaslt_api.h), so a wrong transpose, leading dimension, type or beta here fails
// the cuda-sim tests in CI exactly as it would fail on a GPU.
//
// Row-major to cuBLAS column-major: a row-major (r, c) matrix is the column-major (c, r) matrix
// with the same bytes, so each product is computed transposed:
//   out^T (OC,N)  = op_T(w: IC x OC, ld IC) * x^T (IC x N, ld IC)
//   dx^T  (IC,N)  = w^T (IC x OC, ld IC)    * dout^T (OC x N, ld OC)
//   dw^T  (IC,OC) += x^T (IC x N, ld IC)    * op_T(dout^T: OC x N, ld OC)
#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/device.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

bool cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
const char* cublas_describe(cublasStatus_t s) { return cublaslt_api().cublasLtGetStatusString(s); }

#define LT_CUBLAS_CHECK(call) LT_API_CHECK("cuBLASLt", call, cublas_ok, cublas_describe)

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's recommended size on Hopper

// One cuBLASLt handle and workspace per process (one process per GPU). The workspace comes from
// device_alloc so that device_memory_stats() counts it.
struct Blas {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  Blas() {
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtCreate(&handle));
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
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  }
  ~MatmulDesc() { cublaslt_api().cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, int rows, int cols, int ld) {
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  }
  ~Layout() { cublaslt_api().cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() {
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulPreferenceCreate(&p));
    const size_t ws = kWorkspaceBytes;
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  }
  ~Preference() { cublaslt_api().cublasLtMatmulPreferenceDestroy(p); }
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
  LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulAlgoGetHeuristic(b.handle, desc.d, la.l, lb.l, ld.l, ld.l, pref.p, 1, &result, &found));
  if (found == 0) fail(strcat("cuBLASLt has no algorithm for a ", m, "x", n, "x", k, " bf16 product"));
  const float alpha = 1.f;
  LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmul(b.handle, desc.d, &alpha, A, la.l, B, lb.l, &beta, D, ld.l, D, ld.l, &result.algo,
                                 b.workspace, kWorkspaceBytes, stream));
}

}  // namespace

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
