// cuBLASLt for --device cuda-sim (cublaslt_api.h): the descriptors that matmul.cu builds are
// interpreted on the CPU as the GPU library reads them, and what the library would refuse, or what
// would fault on the device, is refused here with the reason on stderr:
//   * operations N/T, layouts (type, rows, columns, leading dimension >= rows, column order),
//     compute type 32F with a 32F scale, A/B of one type (bf16 or fp32), C and D of one type;
//   * op(A) m x k, op(B) k x n, C and D m x n; C == D only with identical layouts;
//   * every operand's extent (and the workspace) inside one live device allocation, element-aligned;
//   * an algorithm from cublasLtMatmulAlgoGetHeuristic for the same problem, and operands at least
//     as aligned as the preference it was found with promised (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_
//     A/B/C/D_BYTES, 256 by default, as in the library: an algorithm may use vector loads that
//     a less aligned pointer would fault on), so a plan reused for other pointers is caught.
// A call is checked when it is made; the product is queued on its stream (kernels/sim/stream_sim.h).
//
// The product itself has a fixed summation order, so results do not depend on the machine's BLAS,
// its core type or the thread count (the cuda-sim tests compare 1, 2 and 3 ranks bit for bit in the
// device math): each element of D is the dot product of a row of op(A) and a column of op(B) in fp32,
// taken in 8 interleaved partial sums (k mod 8) combined pairwise, then the k mod 8 tail in order;
// then alpha * sum + beta * C in fp32, rounded to D's type (bf16: round to nearest even). This file
// is compiled with -ffp-contract=off so that no compiler fuses the products and sums differently.
#include <omp.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/device_ledger.h"
#include "sim/stream_sim.h"

LT_CUDA_NAMESPACE_BEGIN
namespace {

constexpr uint64_t kMagic = 0x6c74636c744c7453ull;  // marks descriptors this emulation created

struct Desc {
  uint64_t magic = kMagic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
};
struct MatrixLayout {
  uint64_t magic = kMagic;
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Preference {
  uint64_t magic = kMagic;
  uint64_t max_workspace = 0;
  uint32_t min_align[4] = {256, 256, 256, 256};  // A, B, C, D bytes
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(MatrixLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

int g_handle;  // the one handle: its address

// Prints why a call is refused (the caller's check reports the call and the status) and returns s.
cublasStatus_t refuse(cublasStatus_t s, const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::fprintf(stderr, "cuda-sim cuBLASLt: ");
  std::vfprintf(stderr, fmt, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  return s;
}

template <class T, class Opaque>
T* state(Opaque* o) {
  auto* s = reinterpret_cast<T*>(o);
  return o && s->magic == kMagic ? s : nullptr;
}

size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
const char* type_name(cudaDataType_t t) {
  return t == CUDA_R_32F ? "fp32" : t == CUDA_R_16BF ? "bf16" : "unsupported type";
}

const char* status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}

cublasStatus_t create(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(&g_handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t desc_create(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only CUBLAS_COMPUTE_32F with a CUDA_R_32F scale is emulated");
  auto* o = new cublasLtMatmulDescOpaque_t{};
  auto* d = new (o) Desc;
  d->compute = compute;
  d->scale = scale;
  *desc = o;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t desc_set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size) {
  Desc* d = state<Desc>(desc);
  if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a matmul descriptor that was not created");
  if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matmul descriptor attribute %d is not emulated", int(attr));
  int32_t op = 0;
  if (size != sizeof op) return refuse(CUBLAS_STATUS_INVALID_VALUE, "TRANSA/TRANSB take 4 bytes, not %zu", size);
  std::memcpy(&op, buf, sizeof op);
  if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "operation %d (only N and T for real types)", op);
  (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->op_a : d->op_b) = static_cast<cublasOperation_t>(op);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t desc_destroy(cublasLtMatmulDesc_t desc) {
  if (desc) delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t layout_create(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols,
                             int64_t ld) {
  if (type != CUDA_R_16BF && type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matrix type %d (bf16 and fp32 are emulated)", int(type));
  if (ld < int64_t(rows > 0 ? rows : 1))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "leading dimension %lld < rows %llu of a column-major matrix",
                  (long long)ld, (unsigned long long)rows);
  auto* o = new cublasLtMatrixLayoutOpaque_t{};
  auto* l = new (o) MatrixLayout;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = o;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t layout_destroy(cublasLtMatrixLayout_t layout) {
  if (layout) delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t pref_create(cublasLtMatmulPreference_t* pref) {
  auto* o = new cublasLtMatmulPreferenceOpaque_t{};
  new (o) Preference;
  *pref = o;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t pref_set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                        size_t size) {
  Preference* p = state<Preference>(pref);
  if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a preference that was not created");
  if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    uint32_t bytes = 0;
    if (size != sizeof bytes) return refuse(CUBLAS_STATUS_INVALID_VALUE, "MIN_ALIGNMENT takes 4 bytes, not %zu", size);
    std::memcpy(&bytes, buf, sizeof bytes);
    if (bytes == 0 || (bytes & (bytes - 1)) != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "a minimum alignment of %u bytes (a power of two)", bytes);
    p->min_align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = bytes;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d is not emulated", int(attr));
  if (size != sizeof p->max_workspace)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "MAX_WORKSPACE_BYTES takes 8 bytes, not %zu", size);
  std::memcpy(&p->max_workspace, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t pref_destroy(cublasLtMatmulPreference_t pref) {
  if (pref) delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

// The problem the four layouts describe under desc, checked as the library checks it.
struct Problem {
  const Desc* desc;
  const MatrixLayout *a, *b, *c, *d;
  uint64_t m, n, k;
};

cublasStatus_t make_problem(Problem* p, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                            cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D) {
  p->desc = state<Desc>(desc);
  p->a = state<MatrixLayout>(A), p->b = state<MatrixLayout>(B);
  p->c = state<MatrixLayout>(C), p->d = state<MatrixLayout>(D);
  if (!p->desc || !p->a || !p->b || !p->c || !p->d)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "a descriptor or layout that was not created");
  const bool ta = p->desc->op_a == CUBLAS_OP_T, tb = p->desc->op_b == CUBLAS_OP_T;
  p->m = ta ? p->a->cols : p->a->rows;
  p->k = ta ? p->a->rows : p->a->cols;
  const uint64_t kb = tb ? p->b->cols : p->b->rows;
  p->n = tb ? p->b->rows : p->b->cols;
  if (kb != p->k)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "op(A) is %llu x %llu but op(B) is %llu x %llu (TRANSA %s, TRANSB %s)",
                  (unsigned long long)p->m, (unsigned long long)p->k, (unsigned long long)kb,
                  (unsigned long long)p->n, ta ? "T" : "N", tb ? "T" : "N");
  for (const MatrixLayout* l : {p->c, p->d})
    if (l->rows != p->m || l->cols != p->n)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s is %llu x %llu, the product is %llu x %llu", l == p->c ? "C" : "D",
                    (unsigned long long)l->rows, (unsigned long long)l->cols, (unsigned long long)p->m,
                    (unsigned long long)p->n);
  if (p->a->type != p->b->type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A is %s and B is %s", type_name(p->a->type), type_name(p->b->type));
  if (p->c->type != p->d->type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C is %s and D is %s", type_name(p->c->type), type_name(p->d->type));
  if (p->a->type == CUDA_R_32F && p->d->type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "fp32 A and B with a bf16 D");
  return CUBLAS_STATUS_SUCCESS;
}

// The algorithm records the problem it was found for (data[0..4]) and the operand alignments the
// preference promised (data[5], a byte each for log2 of A, B, C, D).
void stamp(cublasLtMatmulAlgo_t* algo, const Problem& p, const uint32_t min_align[4]) {
  *algo = cublasLtMatmulAlgo_t{};
  algo->data[0] = kMagic;
  algo->data[1] = p.m, algo->data[2] = p.n, algo->data[3] = p.k;
  algo->data[4] = uint64_t(p.a->type) << 32 | uint64_t(p.d->type);
  for (int i = 0; i < 4; ++i) algo->data[5] |= uint64_t(__builtin_ctz(min_align[i])) << (8 * i);
}
bool stamped_for(const cublasLtMatmulAlgo_t& algo, const Problem& p) {
  cublasLtMatmulAlgo_t want;
  const uint32_t any[4] = {1, 1, 1, 1};
  stamp(&want, p, any);
  return std::memcmp(&algo, &want, 5 * sizeof want.data[0]) == 0;
}
uint32_t stamped_alignment(const cublasLtMatmulAlgo_t& algo, int operand) {
  return 1u << ((algo.data[5] >> (8 * operand)) & 0xff);
}

cublasStatus_t heuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                         cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                         cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
                         int* returned) {
  if (handle != reinterpret_cast<cublasLtHandle_t>(&g_handle)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "no handle");
  const Preference* preference = state<Preference>(pref);
  if (!preference) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a preference that was not created");
  if (requested < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "requestedAlgoCount %d", requested);
  Problem p;
  if (const cublasStatus_t s = make_problem(&p, desc, A, B, C, D); s != CUBLAS_STATUS_SUCCESS) return s;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  stamp(&results[0].algo, p, preference->min_align);
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// Bytes from a column-major matrix's first element to one past its last.
size_t extent_bytes(const MatrixLayout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((l.cols - 1) * uint64_t(l.ld) + l.rows) * element_bytes(l.type);
}

cublasStatus_t check_operand(const char* name, const void* p, const MatrixLayout& l) {
  const size_t bytes = extent_bytes(l);
  if (bytes == 0) return CUBLAS_STATUS_SUCCESS;
  if (reinterpret_cast<uintptr_t>(p) % element_bytes(l.type) != 0)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s at %p is not aligned to its %zu-byte elements", name, p,
                  element_bytes(l.type));
  if (!device_ledger().holds(p, bytes))
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "%s (%s, %llu x %llu, ld %lld: %zu bytes from %p) is not inside one device allocation "
                  "(a host pointer, a freed buffer, or past the end of one)",
                  name, type_name(l.type), (unsigned long long)l.rows, (unsigned long long)l.cols, (long long)l.ld,
                  bytes, p);
  return CUBLAS_STATUS_SUCCESS;
}

float load(const void* x, cudaDataType_t t, size_t i) {
  return t == CUDA_R_32F ? static_cast<const float*>(x)[i] : __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
}

// op(X) of a column-major matrix as fp32 rows of length k: rows[r * k + kk] = op(X)(r, kk) when
// the reduction index is op(X)'s column (A), or op(X)(kk, r) when it is its row (B).
std::vector<float> reduction_rows(const void* x, const MatrixLayout& l, bool transposed, bool reduce_over_rows,
                                  uint64_t count, uint64_t k) {
  std::vector<float> rows(count * k);
  // Element (i, j) of op(X) lives at (j, i) of X when transposed.
  auto at = [&](uint64_t i, uint64_t j) {
    return transposed ? load(x, l.type, j + i * uint64_t(l.ld)) : load(x, l.type, i + j * uint64_t(l.ld));
  };
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < int64_t(count); ++r)
    for (uint64_t kk = 0; kk < k; ++kk) rows[r * k + kk] = reduce_over_rows ? at(kk, r) : at(r, kk);
  return rows;
}

typedef float f32x8 __attribute__((vector_size(32)));

// sum_kk a[kk] b[kk] in the fixed order of the header comment.
float dot_fixed_order(const float* a, const float* b, uint64_t k) {
  f32x8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
  uint64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    f32x8 x, y;
    std::memcpy(&x, a + kk, sizeof x);
    std::memcpy(&y, b + kk, sizeof y);
    acc += x * y;
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; kk < k; ++kk) s += a[kk] * b[kk];
  return s;
}

void compute(const Problem& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D) {
  const auto a = reduction_rows(A, *p.a, p.desc->op_a == CUBLAS_OP_T, false, p.m, p.k);  // (m, k)
  const auto b = reduction_rows(B, *p.b, p.desc->op_b == CUBLAS_OP_T, true, p.n, p.k);   // (n, k)
  const int64_t ldc = p.c->ld, ldd = p.d->ld;
  const bool d_f32 = p.d->type == CUDA_R_32F;
  // Each element is computed whole by one thread, so the thread count cannot change it.
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < int64_t(p.n); ++j)
    for (uint64_t i = 0; i < p.m; ++i) {
      float v = alpha * dot_fixed_order(&a[i * p.k], &b[j * p.k], p.k);
      if (beta != 0.f) v += beta * load(C, p.c->type, i + j * ldc);  // beta 0: C is not read (may be NaN)
      if (d_f32)
        static_cast<float*>(D)[i + j * ldd] = v;
      else
        static_cast<__nv_bfloat16*>(D)[i + j * ldd] = __float2bfloat16(v);
    }
}

// The product as an operation on its stream (kernels/sim/stream_sim.h), run when the stream gets
// there: the call is checked now, as the library checks it, but the descriptors may be destroyed
// before the product runs, so it keeps copies of them.
void enqueue_product(const Problem& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  struct Copies {
    Desc desc;
    MatrixLayout a, b, c, d;
  };
  auto copies = std::make_shared<Copies>(Copies{*p.desc, *p.a, *p.b, *p.c, *p.d});
  sim::Access access;
  access.reads = {sim::Range{A, extent_bytes(*p.a)}, sim::Range{B, extent_bytes(*p.b)}};
  if (beta != 0.f) access.reads.push_back(sim::Range{C, extent_bytes(*p.c)});
  access.writes = {sim::Range{D, extent_bytes(*p.d)}, sim::Range{workspace, workspace_bytes}};
  const uint64_t m = p.m, n = p.n, k = p.k;
  sim::enqueue(stream, "cuBLASLt matmul", std::move(access), [=] {
    const Problem q{&copies->desc, &copies->a, &copies->b, &copies->c, &copies->d, m, n, k};
    compute(q, alpha, A, B, beta, C, D);
  });
}

cublasStatus_t matmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                      cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                      const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                      const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (handle != reinterpret_cast<cublasLtHandle_t>(&g_handle)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "no handle");
  Problem p;
  if (const cublasStatus_t s = make_problem(&p, desc, Adesc, Bdesc, Cdesc, Ddesc); s != CUBLAS_STATUS_SUCCESS) return s;
  if (algo && !stamped_for(*algo, p))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the algorithm was found for another problem than this %llux%llux%llu one",
                  (unsigned long long)p.m, (unsigned long long)p.n, (unsigned long long)p.k);
  if (C == D && (p.c->ld != p.d->ld || p.c->type != p.d->type))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "in place (C == D) with different C and D layouts");
  float a = 0, b = 0;
  std::memcpy(&a, alpha, sizeof a);  // CUBLASLT_POINTER_MODE_HOST, the default
  std::memcpy(&b, beta, sizeof b);
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (algo) {
    const void* operands[4] = {A, B, C, D};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i)
      if (reinterpret_cast<uintptr_t>(operands[i]) % stamped_alignment(*algo, i) != 0)
        s = refuse(CUBLAS_STATUS_INVALID_VALUE,
                   "%c at %p is not aligned to the %u bytes the algorithm was chosen for "
                   "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES of its preference)",
                   "ABCD"[i], operands[i], stamped_alignment(*algo, i), "ABCD"[i]);
  }
  if (s == CUBLAS_STATUS_SUCCESS) s = check_operand("A", A, *p.a);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_operand("B", B, *p.b);
  if (s == CUBLAS_STATUS_SUCCESS && b != 0.f) s = check_operand("C", C, *p.c);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_operand("D", D, *p.d);
  if (s == CUBLAS_STATUS_SUCCESS && workspace_bytes > 0 && !device_ledger().holds(workspace, workspace_bytes))
    s = refuse(CUBLAS_STATUS_INVALID_VALUE, "the %zu-byte workspace is not device memory", workspace_bytes);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (p.m > 0 && p.n > 0) enqueue_product(p, a, A, B, b, C, D, workspace, workspace_bytes, stream);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const CublasLtApi& cublaslt_api() {
  static const CublasLtApi api = [] {
    CublasLtApi a;
    a.cublasLtGetStatusString = status_string;
    a.cublasLtCreate = create;
    a.cublasLtMatmulDescCreate = desc_create;
    a.cublasLtMatmulDescSetAttribute = desc_set;
    a.cublasLtMatmulDescDestroy = desc_destroy;
    a.cublasLtMatrixLayoutCreate = layout_create;
    a.cublasLtMatrixLayoutDestroy = layout_destroy;
    a.cublasLtMatmulPreferenceCreate = pref_create;
    a.cublasLtMatmulPreferenceSetAttribute = pref_set;
    a.cublasLtMatmulPreferenceDestroy = pref_destroy;
    a.cublasLtMatmulAlgoGetHeuristic = heuristic;
    a.cublasLtMatmul = matmul;
    return a;
  }();
  return api;
}

LT_CUDA_NAMESPACE_END
