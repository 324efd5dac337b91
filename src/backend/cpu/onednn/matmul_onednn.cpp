// oneDNN matmul with bf16 operands and fp32 output (see matmul_onednn.h), through the C API of
// the dlopen'ed library (onednn_library.h).
#include "backend/cpu/onednn/matmul_onednn.h"

#include "llamatrain/error.h"

#if LLAMATRAIN_HAVE_ONEDNN
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cpu/onednn/onednn_library.h"

namespace lt::cpu::onednn {
namespace {

// The CPU engine, created once and never destroyed (the process ends first).
dnnl_engine_t engine() {
  static const dnnl_engine_t e = [] {
    dnnl_engine_t r = nullptr;
    check(library().engine_create(&r, dnnl_cpu, 0), "engine_create");
    return r;
  }();
  return e;
}

// One product shape: its primitive, the memory objects whose data handles each call sets, and
// the implementation oneDNN chose (e.g. "brg:avx512_core_amx_bf16").
// With B packed, b_md is the layout the kernel chose for B (format "any" at creation).
struct GemmPlan {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr;
  dnnl_memory_desc_t b_md{};
  std::string impl;
};

using GemmKey = std::tuple<bool, bool, int, int, int, int, int, int, bool, bool>;  // ..., accumulate, bf16 C
constexpr int kPackedB = -1;  // ldb of a key whose B is packed (gemm_bf16_pack)

// A packing of op(B) from fp32 into a plan's b_md: a reorder primitive and its two memories.
struct PackPlan {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t src = nullptr, dst = nullptr;
};
using PackKey = std::tuple<GemmKey, bool, int>;  // the product's key, trans_b, ldb of the fp32 source

// op(X) as a (rows, cols) view of row-major storage with leading dimension ld: the transposed view
// swaps the strides instead of moving data (oneDNN reads any strides).
dnnl_memory_desc_t view(int rows, int cols, int ld, bool trans, dnnl_data_type_t type) {
  dnnl_memory_desc_t md;
  const dnnl_dims_t dims = {rows, cols};
  const dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  check(library().memory_desc_init_by_strides(&md, 2, dims, type, strides), "memory_desc_init_by_strides");
  return md;
}

GemmPlan make_plan(const GemmKey& k) {
  const Library& L = library();
  const auto [ta, tb, M, N, K, lda, ldb, ldc, acc, c_bf16] = k;
  const dnnl_memory_desc_t a_md = view(M, K, lda, ta, dnnl_bf16);
  dnnl_memory_desc_t b_md;
  if (ldb == kPackedB) {
    const dnnl_dims_t dims = {K, N};
    check(L.memory_desc_init_by_tag(&b_md, 2, dims, dnnl_bf16, dnnl_format_tag_any), "memory_desc_init_by_tag");
  } else {
    b_md = view(K, N, ldb, tb, dnnl_bf16);
  }
  const dnnl_memory_desc_t c_md = view(M, N, ldc, false, c_bf16 ? dnnl_bf16 : dnnl_f32);
  dnnl_matmul_desc_t desc;
  check(L.matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md), "matmul_desc_init");
  dnnl_primitive_attr_t attr = nullptr;
  check(L.primitive_attr_create(&attr), "primitive_attr_create");
  if (acc) {  // C = A B + C in fp32: the += of a weight gradient
    dnnl_post_ops_t po = nullptr;
    check(L.post_ops_create(&po), "post_ops_create");
    check(L.post_ops_append_sum(po, 1.0f), "post_ops_append_sum");
    check(L.primitive_attr_set_post_ops(attr, po), "primitive_attr_set_post_ops");
    L.post_ops_destroy(po);
  }
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t st = L.primitive_desc_create(&pd, &desc, attr, engine(), nullptr);
  L.primitive_attr_destroy(attr);
  check(st, "matmul primitive_desc_create");
  GemmPlan p;
  const char* impl = nullptr;
  if (L.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) p.impl = impl;
  p.b_md = *L.primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  check(L.primitive_create(&p.prim, pd), "primitive_create");
  L.primitive_desc_destroy(pd);
  check(L.memory_create(&p.a, &a_md, engine(), DNNL_MEMORY_NONE), "memory_create");
  check(L.memory_create(&p.b, &p.b_md, engine(), DNNL_MEMORY_NONE), "memory_create");
  check(L.memory_create(&p.c, &c_md, engine(), DNNL_MEMORY_NONE), "memory_create");
  return p;
}

// What each thread keeps: an in-order stream (a oneDNN stream is not thread-safe, and the bf16
// attention runs products on every OpenMP thread at once), its plans (a model has a few dozen
// shapes) and the implementation its last product used. Owned by a process-wide list that is never
// destroyed (the process ends first), each thread holding only a pointer to its own: the state of
// OpenMP's pool threads, alive at exit, stays reachable from a global, where LeakSanitizer finds
// it without scanning thread-local storage (the sanitizer stage turns that off,
// scripts/test-sanitize.sh).
struct ThreadState {
  dnnl_stream_t stream = nullptr;
  std::map<GemmKey, GemmPlan> plans;
  std::map<PackKey, PackPlan> packs;
  std::string last_impl;
};

ThreadState& thread_state() {
  thread_local ThreadState* mine = nullptr;
  if (mine) return *mine;
  static std::mutex mutex;
  static auto* const all = new std::vector<std::unique_ptr<ThreadState>>();
  auto state = std::make_unique<ThreadState>();
  check(library().stream_create(&state->stream, engine(), dnnl_stream_default_flags), "stream_create");
  std::lock_guard<std::mutex> lock(mutex);
  all->push_back(std::move(state));
  mine = all->back().get();
  return *mine;
}

}  // namespace

namespace {

// This thread's plan for key, made on first use.
const GemmPlan& plan(const GemmKey& key) {
  ThreadState& mine = thread_state();
  auto it = mine.plans.find(key);
  if (it == mine.plans.end()) it = mine.plans.emplace(key, make_plan(key)).first;
  mine.last_impl = it->second.impl;
  return it->second;
}

// C = A B through plan p on this thread's stream (B plain or packed, as p was made).
void execute(const GemmPlan& p, const bf16* A, const void* B, void* C) {
  const Library& L = library();
  check(L.memory_set_data_handle(p.a, const_cast<bf16*>(A)), "memory_set_data_handle");
  check(L.memory_set_data_handle(p.b, const_cast<void*>(B)), "memory_set_data_handle");
  check(L.memory_set_data_handle(p.c, C), "memory_set_data_handle");
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
  ThreadState& mine = thread_state();
  check(L.primitive_execute(p.prim, mine.stream, 3, args), "matmul execute");
  check(L.stream_wait(mine.stream), "stream_wait");
}

// C = op(A) op(B) (+ C), C fp32 or (c_bf16) bf16.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda, const bf16* B, int ldb,
          bool accumulate, void* C, int ldc, bool c_bf16) {
  LT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size ", M, "x", N, "x", K);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty reduction: zeros, or C unchanged when accumulating
    if (!accumulate)
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          if (c_bf16)
            static_cast<bf16*>(C)[size_t(i) * ldc + j] = 0;
          else
            static_cast<float*>(C)[size_t(i) * ldc + j] = 0.f;
        }
    return;
  }
  const GemmKey key{trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, c_bf16};
  execute(plan(key), A, B, C);
}

// The packed product's key: A (M,K) and C (M,N) contiguous, B in the kernel's layout.
GemmKey packed_key(int M, int N, int K, bool c_bf16) {
  LT_CHECK(M > 0 && N > 0 && K > 0, "gemm_bf16 with packed B: empty size ", M, "x", N, "x", K);
  return GemmKey{false, false, M, N, K, K, kPackedB, N, false, c_bf16};
}

// The reorder that rounds op(B) from fp32 (row-major, ld ldb) to bf16 in the plan's layout for B.
PackPlan& pack_plan(const GemmKey& key, bool trans_b, int ldb) {
  ThreadState& mine = thread_state();
  const PackKey pk{key, trans_b, ldb};
  auto it = mine.packs.find(pk);
  if (it != mine.packs.end()) return it->second;
  const Library& L = library();
  const GemmPlan& g = plan(key);
  const dnnl_memory_desc_t src_md = view(std::get<4>(key), std::get<3>(key), ldb, trans_b, dnnl_f32);
  dnnl_primitive_desc_t pd = nullptr;
  check(L.reorder_primitive_desc_create(&pd, &src_md, engine(), &g.b_md, engine(), nullptr), "reorder primitive_desc_create");
  PackPlan p;
  const dnnl_status_t st = L.primitive_create(&p.prim, pd);
  L.primitive_desc_destroy(pd);
  check(st, "reorder primitive_create");
  check(L.memory_create(&p.src, &src_md, engine(), DNNL_MEMORY_NONE), "memory_create");
  check(L.memory_create(&p.dst, &g.b_md, engine(), DNNL_MEMORY_NONE), "memory_create");
  return mine.packs.emplace(pk, p).first->second;
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda, const bf16* B,
               int ldb, bool accumulate, float* C, int ldc) {
  gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, false);
}

void gemm_bf16_out_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda, const bf16* B,
                        int ldb, bf16* C, int ldc) {
  gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, false, C, ldc, true);
}

size_t gemm_bf16_packed_bytes(int M, int N, int K, bool c_bf16) {
  return library().memory_desc_get_size(&plan(packed_key(M, N, K, c_bf16)).b_md);
}

void gemm_bf16_pack(void* Bp, bool trans_b, int M, int N, int K, const float* B, int ldb, bool c_bf16) {
  const Library& L = library();
  const PackPlan& p = pack_plan(packed_key(M, N, K, c_bf16), trans_b, ldb);
  check(L.memory_set_data_handle(p.src, const_cast<float*>(B)), "memory_set_data_handle");
  check(L.memory_set_data_handle(p.dst, Bp), "memory_set_data_handle");
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, p.src}, {DNNL_ARG_TO, p.dst}};
  ThreadState& mine = thread_state();
  check(L.primitive_execute(p.prim, mine.stream, 2, args), "reorder execute");
  check(L.stream_wait(mine.stream), "stream_wait");
}

void gemm_bf16_packed(int M, int N, int K, const bf16* A, const void* Bp, float* C) {
  execute(plan(packed_key(M, N, K, false)), A, Bp, C);
}

void gemm_bf16_packed_out_bf16(int M, int N, int K, const bf16* A, const void* Bp, bf16* C) {
  execute(plan(packed_key(M, N, K, true)), A, Bp, C);
}

size_t gemm_bf16_cached_primitives() { return thread_state().plans.size(); }

std::string gemm_bf16_last_impl() { return thread_state().last_impl; }

std::string effective_isa() {
  switch (library().get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx (AMX bf16 tiles)";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16 (AVX-512 bf16 dot products, no AMX)";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni (no bf16 instructions: converted to fp32)";
    case dnnl_cpu_isa_avx512_core: return "avx512_core (no bf16 instructions: converted to fp32)";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni (no bf16 instructions: converted to fp32)";
    case dnnl_cpu_isa_avx2: return "avx2 (no bf16 instructions: converted to fp32)";
    default: return "pre-AVX2 (no bf16 instructions)";
  }
}

bool has_amx() { return library().get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx; }

bool has_bf16_matmul() {
  // The ISA values are bit sets of features: every AVX-512 core ISA contains avx512_core's bits.
  const unsigned isa = library().get_effective_cpu_isa();
  return (isa & unsigned(dnnl_cpu_isa_avx512_core)) == unsigned(dnnl_cpu_isa_avx512_core);
}

std::string version() {
  const dnnl_version_t* v = library().version();
  return strcat(v->major, ".", v->minor, ".", v->patch, " (", library().path, ")");
}

}  // namespace lt::cpu::onednn
#else  // built without oneDNN's headers: every entry point says so

namespace lt::cpu::onednn {
namespace {
[[noreturn]] void missing() {
  fail("--precision bf16 on the CPU: this llamatrain was built without oneDNN's headers (Debian: "
       "libdnnl-dev, scripts/install-deps.sh); rebuild after installing them");
}
}  // namespace
void gemm_bf16(bool, bool, int, int, int, const bf16*, int, const bf16*, int, bool, float*, int) { missing(); }
void gemm_bf16_out_bf16(bool, bool, int, int, int, const bf16*, int, const bf16*, int, bf16*, int) { missing(); }
size_t gemm_bf16_packed_bytes(int, int, int, bool) { missing(); }
void gemm_bf16_pack(void*, bool, int, int, int, const float*, int, bool) { missing(); }
void gemm_bf16_packed(int, int, int, const bf16*, const void*, float*) { missing(); }
void gemm_bf16_packed_out_bf16(int, int, int, const bf16*, const void*, bf16*) { missing(); }
size_t gemm_bf16_cached_primitives() { return 0; }
std::string gemm_bf16_last_impl() { return ""; }
std::string effective_isa() { missing(); }
bool has_amx() { missing(); }
bool has_bf16_matmul() { missing(); }
std::string version() { missing(); }
}  // namespace lt::cpu::onednn
#endif
