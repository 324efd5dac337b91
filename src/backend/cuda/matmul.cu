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
// Plans (descriptors, alignment preferences and the heuristic's algorithm) are cached by problem
// and operand alignment (PlanKey); device_counters().plans_built counts the ones built.
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/device.h"
#include "llamatrain/error.h"
#include "llamatrain/zero.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

bool cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
const char* cublas_describe(cublasStatus_t s) { return cublaslt_api().cublasLtGetStatusString(s); }

#define LT_CUBLAS_CHECK(call) LT_API_CHECK("cuBLASLt", call, cublas_ok, cublas_describe)

constexpr size_t kWorkspaceBytes = kCublasLtWorkspaceBytes;  // cuBLASLt's recommended size on Hopper (zero.h)

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

// Owners of the cuBLASLt descriptors of one plan.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc(cublasOperation_t ta, cublasOperation_t tb) {
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  }
  ~MatmulDesc() { cublaslt_api().cublasLtMatmulDescDestroy(d); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, int rows, int cols, int ld) {
    LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  }
  ~Layout() { cublaslt_api().cublasLtMatrixLayoutDestroy(l); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

// What a plan depends on: the problem (operations, sizes, leading dimensions, types; no epilogue)
// and the alignment of each operand's address, which the algorithm may rely on. Built once per key
// (descriptors and one heuristic query, ~15-40 us of CPU each on a GPU) and reused: a step has
// a handful of distinct products but hundreds of calls.
struct PlanKey {
  int ta, tb, m, n, k, lda, ldb, ldd;
  int d_type;
  uint32_t align_a, align_b, align_d;  // C is D
  bool operator<(const PlanKey& o) const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldd, d_type, align_a, align_b, align_d) <
           std::tie(o.ta, o.tb, o.m, o.n, o.k, o.lda, o.ldb, o.ldd, o.d_type, o.align_a, o.align_b, o.align_d);
  }
};

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

struct Plan {
  MatmulDesc desc;
  Layout la, lb, ld;  // ld describes C and D
  cublasLtMatmulHeuristicResult_t result{};
  explicit Plan(const PlanKey& key);
};

Plan::Plan(const PlanKey& key)
    : desc(cublasOperation_t(key.ta), cublasOperation_t(key.tb)),
      la(CUDA_R_16BF, key.ta == CUBLAS_OP_N ? key.m : key.k, key.ta == CUBLAS_OP_N ? key.k : key.m, key.lda),
      lb(CUDA_R_16BF, key.tb == CUBLAS_OP_N ? key.k : key.n, key.tb == CUBLAS_OP_N ? key.n : key.k, key.ldb),
      ld(cudaDataType_t(key.d_type), key.m, key.n, key.ldd) {
  const CublasLtApi& api = cublaslt_api();
  cublasLtMatmulPreference_t pref = nullptr;
  LT_CUBLAS_CHECK(api.cublasLtMatmulPreferenceCreate(&pref));
  struct Release {
    cublasLtMatmulPreference_t p;
    ~Release() { cublaslt_api().cublasLtMatmulPreferenceDestroy(p); }
  } release{pref};
  const size_t ws = kWorkspaceBytes;
  LT_CUBLAS_CHECK(api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  for (const auto& [attr, bytes] : aligns)
    LT_CUBLAS_CHECK(api.cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  int found = 0;
  LT_CUBLAS_CHECK(api.cublasLtMatmulAlgoGetHeuristic(blas().handle, desc.d, la.l, lb.l, ld.l, ld.l, pref, 1, &result,
                                                    &found));
  if (found == 0)
    fail(strcat("cuBLASLt has no algorithm for a ", key.m, "x", key.n, "x", key.k, " bf16 product (alignments ",
                key.align_a, "/", key.align_b, "/", key.align_d, " bytes)"));
  count_plan_built();
}

// The plan for key, built on first use. One host thread drives the device (one process per GPU).
const Plan& plan_for(const PlanKey& key) {
  static std::map<PlanKey, std::unique_ptr<Plan>>* plans = new std::map<PlanKey, std::unique_ptr<Plan>>;
  auto it = plans->find(key);
  if (it == plans->end()) it = plans->emplace(key, std::make_unique<Plan>(key)).first;
  return *it->second;
}

// D (m,n) = alpha op(A) op(B) + beta C, column-major; C and D share storage and type.
void lt_matmul(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, int lda,
               const void* B, int ldb, float beta, void* D, cudaDataType_t d_type, int ldd, cudaStream_t stream) {
  Blas& b = blas();
  const PlanKey key{int(ta), int(tb), m, n, k, lda, ldb, ldd, int(d_type), alignment_of(A), alignment_of(B),
                    alignment_of(D)};
  const Plan& plan = plan_for(key);
  const float alpha = 1.f;
  LT_CUBLAS_CHECK(cublaslt_api().cublasLtMatmul(b.handle, plan.desc.d, &alpha, A, plan.la.l, B, plan.lb.l, &beta, D,
                                                plan.ld.l, D, plan.ld.l, &plan.result.algo, b.workspace,
                                                kWorkspaceBytes, stream));
}

}  // namespace

void matmul_forward(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int N, int IC, int OC,
                    cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  lt_matmul(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, x, IC, 0.f, out, CUDA_R_16BF, OC, stream);
}

void matmul_forward_f32(float* out, const __nv_bfloat16* x, const __nv_bfloat16* w, int N, int IC, int OC,
                        cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  lt_matmul(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, x, IC, 0.f, out, CUDA_R_32F, OC, stream);
}

void matmul_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dout, const __nv_bfloat16* x,
                     const __nv_bfloat16* w, int N, int IC, int OC, cudaStream_t stream) {
  if (N <= 0 || IC <= 0 || OC <= 0) return;
  if (dx) lt_matmul(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, OC, 0.f, dx, CUDA_R_16BF, IC, stream);
  if (dw) lt_matmul(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, x, IC, dout, OC, 1.f, dw, CUDA_R_32F, IC, stream);
}

LT_CUDA_NAMESPACE_END
