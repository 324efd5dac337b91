// cuDNN's fused causal attention through the backend graph API (see cudnn_attention.h), and the
// dlopen loader of cudnn_library.h. Compiled by nvcc only.
//
// cuDNN 9 (before 9.21) has no causal option on its SDPA operation descriptor; its flash-attention
// engines are reached by describing the computation as a graph of matmul, pointwise and reduction
// operations that the engine recognises as a whole (cuDNN developer guide, "Graph API", fused
// flash attention fprop/bprop). Layout: every tensor is 4-D (b, h, s, d) with explicit strides, so
// our (B, T, heads, hd) rows are used in place: strides (T*token_stride, head_stride, token_stride,
// 1). K enters the first matmul transposed, as (b, h, d, s) with the last two strides swapped; GQA
// is the matmul's broadcast of KV head h / (H/KVH) over the H query heads, and in the backward
// pass dK and dV are computed per query head and summed over each group by a reduction.
//
// Forward (one graph; S, P never leave the engine):
//   S = Q K^T * scale; S = causal(S) (-inf above the diagonal, GEN_INDEX row >= col);
//   M = rowmax S; E = exp(S - M); Z = rowsum E; Stats = M + log Z; P = E / Z (bf16); O = P V.
// Backward (one graph; the frontend's composition for cuDNN >= 9.0):
//   D = rowsum(dO * O) (written: our dsum); P = exp(causal(Q K^T * scale - Stats));
//   dV = P^T dO; dS = P * (dO V^T - D) * scale; dK = dS^T Q; dQ = dS K through an fp32
//   accumulator (dq_accum, our buffer) copied to bf16 dQ.
#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cudnn_library.h"
#include "runtime/dynamic_library.h"
#include "llamatrain/error.h"

namespace lt::cudnn {

std::vector<std::string> library_candidates() {
  const char* chosen = std::getenv("LLAMATRAIN_CUDNN_LIBRARY");
  if (chosen && *chosen) return {chosen};
  return dynlib::with_python_wheels(
      {LT_CUDNN_SONAME, LT_CUDNN_DIR "/" LT_CUDNN_SONAME, "/usr/local/cuda/lib64/" LT_CUDNN_SONAME}, {"cudnn"},
      LT_CUDNN_SONAME);
}

namespace {

// ---- the library ----------------------------------------------------------------------------------
struct Api {
  decltype(&::cudnnGetVersion) cudnnGetVersion = nullptr;
  decltype(&::cudnnGetErrorString) cudnnGetErrorString = nullptr;
  decltype(&::cudnnGetLastErrorString) cudnnGetLastErrorString = nullptr;
  decltype(&::cudnnCreate) cudnnCreate = nullptr;
  decltype(&::cudnnSetStream) cudnnSetStream = nullptr;
  decltype(&::cudnnBackendCreateDescriptor) cudnnBackendCreateDescriptor = nullptr;
  decltype(&::cudnnBackendDestroyDescriptor) cudnnBackendDestroyDescriptor = nullptr;
  decltype(&::cudnnBackendSetAttribute) cudnnBackendSetAttribute = nullptr;
  decltype(&::cudnnBackendGetAttribute) cudnnBackendGetAttribute = nullptr;
  decltype(&::cudnnBackendFinalize) cudnnBackendFinalize = nullptr;
  decltype(&::cudnnBackendExecute) cudnnBackendExecute = nullptr;
};

Api load_api() {
  const char* chosen = std::getenv("LLAMATRAIN_CUDNN_LIBRARY");
  std::string tried;
  void* lib = dynlib::open_first(library_candidates(), &tried);
  if (!lib)
    fail(strcat("--attention cudnn needs cuDNN 9 (", LT_CUDNN_SONAME, "), which could not be loaded",
                chosen && *chosen ? " from $LLAMATRAIN_CUDNN_LIBRARY" : "", ":", tried,
                "\nInstall cuDNN 9 for this CUDA version or set LLAMATRAIN_CUDNN_LIBRARY to its path; "
                "--attention native needs no cuDNN."));
  Api a;
  auto load = [&](auto& fn, const char* name) { dynlib::load_symbol(lib, fn, name, "cuDNN (9 expected)"); };
  load(a.cudnnGetVersion, "cudnnGetVersion");
  load(a.cudnnGetErrorString, "cudnnGetErrorString");
  load(a.cudnnGetLastErrorString, "cudnnGetLastErrorString");
  load(a.cudnnCreate, "cudnnCreate");
  load(a.cudnnSetStream, "cudnnSetStream");
  load(a.cudnnBackendCreateDescriptor, "cudnnBackendCreateDescriptor");
  load(a.cudnnBackendDestroyDescriptor, "cudnnBackendDestroyDescriptor");
  load(a.cudnnBackendSetAttribute, "cudnnBackendSetAttribute");
  load(a.cudnnBackendGetAttribute, "cudnnBackendGetAttribute");
  load(a.cudnnBackendFinalize, "cudnnBackendFinalize");
  load(a.cudnnBackendExecute, "cudnnBackendExecute");
  // The attribute and enum values below are cuDNN 9's (compiled against 9.x headers).
  const size_t version = a.cudnnGetVersion();
  if (version < 90000 || version >= 100000)
    fail(strcat("--attention cudnn: the loaded cuDNN is version ", version, "; cuDNN 9 is needed"));
  return a;
}

// Loaded once; a failed load throws and is retried by the next call (static initialisation).
const Api& api() {
  static const Api a = load_api();
  return a;
}

bool cudnn_ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
// The status and cuDNN's own explanation of the last failure (e.g. which graph node it rejected).
std::string cudnn_describe(cudnnStatus_t s) {
  char last[1024] = {0};
  api().cudnnGetLastErrorString(last, sizeof last);
  return last[0] ? strcat(api().cudnnGetErrorString(s), " (", last, ")") : std::string(api().cudnnGetErrorString(s));
}
#define LT_CUDNN_CHECK(call) LT_API_CHECK("cuDNN", call, cudnn_ok, cudnn_describe)

cudnnStatus_t set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t count, const void* values) {
  return api().cudnnBackendSetAttribute(d, name, type, count, values);
}
cudnnStatus_t finalize(cudnnBackendDescriptor_t d) { return api().cudnnBackendFinalize(d); }

// An owned backend descriptor.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    LT_CUDNN_CHECK(api().cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Descriptor() {
    if (d_) api().cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&&) = delete;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// ---- graphs ---------------------------------------------------------------------------------------
// A 4-D tensor shape (b, h, s, d) with strides in elements.
struct Shape {
  std::array<int64_t, 4> dims, strides;
};

// A finalized execution plan and the descriptors it was built from (kept alive with it).
struct Plan {
  std::deque<Descriptor> owned;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
};

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum, kScale, kNegInf, kOne,
  kFirstVirtual = 100
};

class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  // A tensor the caller binds in the variant pack (uid), or a scalar passed by value (a host pointer
  // in the variant pack).
  cudnnBackendDescriptor_t io(int64_t uid, cudnnDataType_t type, const Shape& s) {
    return tensor(uid, type, s, false, false);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, Shape{{1, 1, 1, 1}, {1, 1, 1, 1}}, false, true);
  }
  // An intermediate that exists only inside the fused engine.
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Shape& s) {
    return tensor(next_virtual_++, type, s, true, false);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Descriptor& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    LT_CUDNN_CHECK(set(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    LT_CUDNN_CHECK(finalize(mm.get()));
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    const cudnnBackendDescriptor_t mmd = mm.get();
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mmd));
    add(op);
  }

  // y = mode(x[, b[, t]]); b and t may be null. GEN_INDEX takes the axis it numbers.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Descriptor& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    LT_CUDNN_CHECK(set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    LT_CUDNN_CHECK(set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (axis >= 0) LT_CUDNN_CHECK(set(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    LT_CUDNN_CHECK(finalize(pw.get()));
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const cudnnBackendDescriptor_t pwd = pw.get();
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b) LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    if (t) LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    add(op);
  }

  // y = reduce(x) over the dimensions where y is smaller (size 1, or H -> KVH for a GQA group sum).
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& rd = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    LT_CUDNN_CHECK(set(rd.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    LT_CUDNN_CHECK(set(rd.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    LT_CUDNN_CHECK(finalize(rd.get()));
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    const cudnnBackendDescriptor_t rdd = rd.get();
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rdd));
    add(op);
  }

  // y is x seen through other dims/strides (a transpose; also a bf16 view of an fp32 intermediate).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    LT_CUDNN_CHECK(set(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    add(op);
  }

  // The operation graph, then the first engine configuration (heuristics mode A, then the fallback
  // list) whose execution plan finalizes. Throws naming the graph when none does.
  Plan build(const std::string& what) {
    Descriptor& graph = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    LT_CUDNN_CHECK(set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                       static_cast<int64_t>(ops_.size()), ops_.data()));
    LT_CUDNN_CHECK(set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_));
    LT_CUDNN_CHECK(finalize(graph.get()));
    const cudnnBackendDescriptor_t graph_d = graph.get();
    std::string why = "no engine configuration";
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      LT_CUDNN_CHECK(
          set(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph_d));
      LT_CUDNN_CHECK(set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
      cudnnStatus_t s = finalize(heur.get());
      if (!cudnn_ok(s)) {
        why = strcat("engine heuristics: ", cudnn_describe(s));
        continue;
      }
      int64_t count = 0;
      LT_CUDNN_CHECK(api().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
      if (count <= 0) continue;
      count = std::min<int64_t>(count, 32);  // the best-ranked 32: each one tried costs a plan finalization
      std::vector<Descriptor> configs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        raw.push_back(configs.back().get());
      }
      LT_CUDNN_CHECK(api().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()));
      for (int64_t i = 0; i < count && i < static_cast<int64_t>(configs.size()); ++i) {
        Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        const cudnnBackendDescriptor_t cfg = configs[size_t(i)].get();
        LT_CUDNN_CHECK(set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_));
        LT_CUDNN_CHECK(
            set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg));
        s = finalize(plan.get());  // engines that cannot run this graph fail here: try the next
        if (!cudnn_ok(s)) {
          why = strcat("execution plan: ", cudnn_describe(s));
          continue;
        }
        Plan p;
        int64_t n = 0;
        LT_CUDNN_CHECK(api().cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                      CUDNN_TYPE_INT64, 1, &n, &p.workspace_bytes));
        p.plan = plan.get();
        p.owned = std::move(owned_);
        p.owned.push_back(std::move(configs[size_t(i)]));
        p.owned.push_back(std::move(plan));
        return p;
      }
    }
    fail(strcat("cuDNN has no engine for the causal attention ", what, " graph on this GPU (last error: ", why,
                "); use --attention native"));
  }

 private:
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Shape& s, bool is_virtual, bool by_value) {
    Descriptor& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    // Every bound tensor is 16-byte aligned (checked before execution); the engines load 16-byte vectors.
    const int64_t alignment = 16;
    LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, s.dims.data()));
    LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, s.strides.data()));
    LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    if (by_value) LT_CUDNN_CHECK(set(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
    LT_CUDNN_CHECK(finalize(t.get()));
    return t.get();
  }
  Descriptor& keep(cudnnBackendDescriptorType_t type) {
    owned_.emplace_back(type);
    return owned_.back();
  }
  void add(Descriptor& op) {
    LT_CUDNN_CHECK(finalize(op.get()));
    ops_.push_back(op.get());
  }

  cudnnHandle_t handle_;
  std::deque<Descriptor> owned_;  // a deque: references stay valid as it grows
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// ---- the attention graphs ---------------------------------------------------------------------------
using cuda::AttentionHeads;
using cuda::AttentionParams;

// (B, T, n_heads, hd) rows as cuDNN's (b, h, s, d), and transposed as (b, h, d, s).
template <class T>
Shape bhsd(const AttentionParams& p, int n_heads, const AttentionHeads<T>& x) {
  return {{p.B, n_heads, p.T, p.hd}, {p.T * x.token_stride, x.head_stride, x.token_stride, 1}};
}
template <class T>
Shape bhds(const AttentionParams& p, int n_heads, const AttentionHeads<T>& x) {
  return {{p.B, n_heads, p.hd, p.T}, {p.T * x.token_stride, x.head_stride, 1, x.token_stride}};
}
// Dense intermediates: scores (b, h, s_q, s_kv), their transpose, per-row statistics (b, h, s, 1)
// (also the layout of our lse and dsum), and a dense (b, h, s, d) head tensor.
Shape scores(const AttentionParams& p) {
  const int64_t T = p.T;
  return {{p.B, p.H, T, T}, {p.H * T * T, T * T, T, 1}};
}
Shape scores_t(const AttentionParams& p) {
  const int64_t T = p.T;
  return {{p.B, p.H, T, T}, {p.H * T * T, T * T, 1, T}};
}
Shape rows(const AttentionParams& p) {
  const int64_t T = p.T;
  return {{p.B, p.H, T, 1}, {p.H * T, T, 1, 1}};
}
Shape dense_heads(const AttentionParams& p) {
  const int64_t T = p.T, hd = p.hd;
  return {{p.B, p.H, T, hd}, {p.H * T * hd, T * hd, hd, 1}};
}

// x with -inf where the key comes after the query (row index < column index).
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const AttentionParams& p, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t neg_inf) {
  const cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, scores(p));
  const cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, scores(p));
  const cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, scores(p));
  const cudnnBackendDescriptor_t y = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, keep, y);  // keep ? x : -inf
  return y;
}

// c = a b for KV-head-shaped c: directly when H == KVH; otherwise per query head into a bf16
// intermediate, then summed over each group of H/KVH heads.
void matmul_kv_heads(GraphBuilder& g, const AttentionParams& p, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                     cudnnBackendDescriptor_t c) {
  if (p.H == p.KVH) return g.matmul(a, b, c);
  const cudnnBackendDescriptor_t full = g.virt(CUDNN_DATA_BFLOAT16, dense_heads(p));
  g.matmul(a, b, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, c);
}

// The forward graph's tensors and operations (each finalized: cuDNN checks types and shapes there).
void describe_forward(GraphBuilder& g, const AttentionParams& p) {
  const auto q = g.io(kQ, CUDNN_DATA_BFLOAT16, bhsd(p, p.H, p.q));
  const auto kt = g.io(kK, CUDNN_DATA_BFLOAT16, bhds(p, p.KVH, p.k));
  const auto v = g.io(kV, CUDNN_DATA_BFLOAT16, bhsd(p, p.KVH, p.v));
  const auto o = g.io(kO, CUDNN_DATA_BFLOAT16, bhsd(p, p.H, p.out));
  const auto stats = g.io(kStats, CUDNN_DATA_FLOAT, rows(p));
  const auto scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf);

  const auto s = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.matmul(q, kt, s);
  const auto s_scaled = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, s_scaled);
  const auto masked = causal_mask(g, p, s_scaled, neg_inf);

  const auto row_max = g.virt(CUDNN_DATA_FLOAT, rows(p));
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  const auto shifted = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_SUB, masked, row_max, nullptr, shifted);
  const auto e = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  const auto row_sum = g.virt(CUDNN_DATA_FLOAT, rows(p));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  const auto log_sum = g.virt(CUDNN_DATA_FLOAT, rows(p));
  g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, nullptr, stats);
  // The second matmul takes P in the I/O type (the pattern cuDNN fuses).
  const auto prob = g.virt(CUDNN_DATA_BFLOAT16, scores(p));
  g.pointwise(CUDNN_POINTWISE_DIV, e, row_sum, nullptr, prob);
  g.matmul(prob, v, o);
}

void describe_backward(GraphBuilder& g, const AttentionParams& p) {
  const auto q = g.io(kQ, CUDNN_DATA_BFLOAT16, bhsd(p, p.H, p.q));
  const auto kt = g.io(kK, CUDNN_DATA_BFLOAT16, bhds(p, p.KVH, p.k));
  const auto vt = g.io(kV, CUDNN_DATA_BFLOAT16, bhds(p, p.KVH, p.v));
  const auto o = g.io(kO, CUDNN_DATA_BFLOAT16, bhsd(p, p.H, p.out));
  const auto stats = g.io(kStats, CUDNN_DATA_FLOAT, rows(p));
  const auto dout = g.io(kDO, CUDNN_DATA_BFLOAT16, bhsd(p, p.H, p.dout));
  const auto dq = g.io(kDQ, CUDNN_DATA_BFLOAT16, bhsd(p, p.H, p.dq));
  const auto dk = g.io(kDK, CUDNN_DATA_BFLOAT16, bhsd(p, p.KVH, p.dk));
  const auto dv = g.io(kDV, CUDNN_DATA_BFLOAT16, bhsd(p, p.KVH, p.dv));
  const auto softmax_sum = g.io(kSoftmaxSum, CUDNN_DATA_FLOAT, rows(p));
  const auto dq_accum = g.io(kDQAccum, CUDNN_DATA_FLOAT, dense_heads(p));
  const auto scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf), one = g.scalar(kOne);

  // D = rowsum(dO * O), times the dropout keep-probability, which is 1 here: the engine's pattern
  // has that multiply in place.
  const int64_t T = p.T, hd = p.hd;
  const auto d_o = g.virt(CUDNN_DATA_FLOAT, Shape{{p.B, p.H, T, hd}, {T * p.H * hd, hd, p.H * hd, 1}});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, d_o);
  const auto d_raw = g.virt(CUDNN_DATA_FLOAT, rows(p));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o, d_raw);
  g.pointwise(CUDNN_POINTWISE_MUL, d_raw, one, nullptr, softmax_sum);

  // P = exp(causal(Q K^T scale) - Stats), recomputed from the forward's statistics.
  const auto s = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.matmul(q, kt, s);
  const auto s_scaled = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, nullptr, s_scaled);
  const auto s_centered = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_SUB, s_scaled, stats, nullptr, s_centered);
  const auto masked = causal_mask(g, p, s_centered, neg_inf);
  const auto prob = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, prob);

  // dV = P^T dO.
  const auto prob_t = g.virt(CUDNN_DATA_BFLOAT16, scores_t(p));
  g.reshape(prob, prob_t);
  matmul_kv_heads(g, p, prob_t, dout, dv);

  // dS = P * (dO V^T - D) * scale.
  const auto dp = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.matmul(dout, vt, dp);
  const auto dp_centered = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp_centered);
  const auto ds_unscaled = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, prob, nullptr, ds_unscaled);
  const auto ds = g.virt(CUDNN_DATA_FLOAT, scores(p));
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, nullptr, ds);

  // dK = dS^T Q.
  const auto ds_t = g.virt(CUDNN_DATA_BFLOAT16, scores_t(p));
  g.reshape(ds, ds_t);
  matmul_kv_heads(g, p, ds_t, q, dk);

  // dQ = dS K, accumulated in fp32 and then written as bf16.
  const auto k = g.virt(CUDNN_DATA_BFLOAT16, bhsd(p, p.KVH, p.k));
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq);
}

Plan build_plan(cudnnHandle_t handle, bool backward, const AttentionParams& p) {
  GraphBuilder g(handle);
  if (backward) {
    describe_backward(g, p);
    return g.build("backward");
  }
  describe_forward(g, p);
  return g.build("forward");
}

// ---- execution --------------------------------------------------------------------------------------
// One cuDNN handle per process (one process per GPU), the plans by shape, and the device memory
// they run in. Never destroyed: at exit the CUDA context may already be gone.
class Context {
 public:
  static Context& get() {
    static Context* c = new Context;
    return *c;
  }

  // The cached plan of this direction and shape (strides included), built on first use.
  const Plan& plan(bool backward, const AttentionParams& p) {
    std::vector<int64_t> key{backward, p.B, p.T, p.H, p.KVH, p.hd};
    for (const auto* h : {&p.q, &p.k, &p.v}) key.insert(key.end(), {h->token_stride, h->head_stride});
    key.insert(key.end(), {p.out.token_stride, p.out.head_stride});
    if (backward) {
      key.insert(key.end(), {p.dout.token_stride, p.dout.head_stride});
      for (const auto* h : {&p.dq, &p.dk, &p.dv}) key.insert(key.end(), {h->token_stride, h->head_stride});
    }
    auto it = plans_.find(key);
    if (it == plans_.end())
      it = plans_.emplace(key, build_plan(handle_, backward, p)).first;
    return it->second;
  }

  void execute(const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
               cudaStream_t stream) {
    void* workspace = grow(workspace_, workspace_bytes_, size_t(plan.workspace_bytes));
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    LT_CUDNN_CHECK(set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                       static_cast<int64_t>(uids.size()), uids.data()));
    LT_CUDNN_CHECK(set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                       static_cast<int64_t>(pointers.size()), pointers.data()));
    LT_CUDNN_CHECK(set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    LT_CUDNN_CHECK(finalize(pack.get()));
    LT_CUDNN_CHECK(api().cudnnSetStream(handle_, stream));
    LT_CUDNN_CHECK(api().cudnnBackendExecute(handle_, plan.plan, pack.get()));
  }

  // The fp32 dQ accumulator of the backward graph (B, H, T, hd). Before cuDNN 9.6 the caller had to
  // zero it; later versions initialise it themselves.
  void* dq_accum(size_t bytes, cudaStream_t stream) {
    void* p = grow(dq_accum_, dq_accum_bytes_, bytes);
    if (version_ < 90600) {
      const cudaError_t e = cudaMemsetAsync(p, 0, bytes, stream);
      if (e != cudaSuccess) fail(strcat("cudaMemsetAsync of the cuDNN dQ accumulator: ", cudaGetErrorString(e)));
    }
    return p;
  }

  // -inf for masked scores; cuDNN before 9.10 wanted the lowest finite float instead.
  float negative_infinity() const {
    return version_ < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
  }

 private:
  Context() : version_(api().cudnnGetVersion()) { LT_CUDNN_CHECK(api().cudnnCreate(&handle_)); }

  static void* grow(void*& buffer, size_t& size, size_t need) {
    if (need > size) {
      if (buffer) cudaFree(buffer);
      buffer = nullptr;
      size = 0;
      const cudaError_t e = cudaMalloc(&buffer, need);
      if (e != cudaSuccess)
        fail(strcat("cannot allocate ", need, " bytes of GPU memory for cuDNN attention: ", cudaGetErrorString(e)));
      size = need;
    }
    return buffer;
  }

  size_t version_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::vector<int64_t>, Plan> plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* dq_accum_ = nullptr;
  size_t dq_accum_bytes_ = 0;
};

template <class T>
void check_heads(const char* op, const char* name, const AttentionHeads<T>& x) {
  if (!x.ptr) fail(strcat(op, ": ", name, " is null"));
  if (reinterpret_cast<uintptr_t>(x.ptr) % 16 != 0 || x.token_stride % 8 != 0 || x.head_stride % 8 != 0)
    fail(strcat(op, ": ", name, " must be 16-byte aligned with strides that are multiples of 8 elements"));
}

// False when there is nothing to do.
bool check_shape(const char* op, const AttentionParams& p) {
  if (p.seg_start)
    fail(strcat(op, ": cuDNN's causal attention takes one example per row (seg_start must be null); batches that "
                "pack several examples into a row need --attention native"));
  if (p.B < 0 || p.T < 0) fail(strcat(op, ": negative batch or sequence length"));
  if (p.KVH <= 0 || p.H <= 0 || p.H % p.KVH != 0)
    fail(strcat(op, ": n_heads ", p.H, " must be a positive multiple of n_kv_heads ", p.KVH));
  // cuDNN's flash-attention engines: head dimension a multiple of 8, at most 128 on every GPU we build for.
  if (p.hd <= 0 || p.hd % 8 != 0 || p.hd > 128)
    fail(strcat(op, ": head_dim ", p.hd, " not supported by cuDNN attention"));
  return p.B > 0 && p.T > 0;
}

void* ptr(const void* p) { return const_cast<void*>(p); }

void forward(const AttentionParams& p, cudaStream_t stream) {
  const char* op = "cudnn_attention_forward";
  if (!check_shape(op, p)) return;
  check_heads(op, "q", p.q), check_heads(op, "k", p.k), check_heads(op, "v", p.v), check_heads(op, "out", p.out);
  if (!p.lse) fail(strcat(op, ": lse is null"));
  Context& c = Context::get();
  const Plan& plan = c.plan(false, p);
  // Scalars passed by value are read from host memory when the graph is launched.
  const float scale = 1.f / std::sqrt(static_cast<float>(p.hd));
  const float neg_inf = c.negative_infinity();
  c.execute(plan, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
            {ptr(p.q.ptr), ptr(p.k.ptr), ptr(p.v.ptr), p.out.ptr, p.lse, ptr(&scale), ptr(&neg_inf)}, stream);
}

void backward(const AttentionParams& p, cudaStream_t stream) {
  const char* op = "cudnn_attention_backward";
  if (!check_shape(op, p)) return;
  check_heads(op, "q", p.q), check_heads(op, "k", p.k), check_heads(op, "v", p.v), check_heads(op, "out", p.out);
  check_heads(op, "dout", p.dout), check_heads(op, "dq", p.dq), check_heads(op, "dk", p.dk);
  check_heads(op, "dv", p.dv);
  if (!p.lse || !p.dsum) fail(strcat(op, ": lse or dsum is null"));
  if (reinterpret_cast<uintptr_t>(p.lse) % 16 != 0 || reinterpret_cast<uintptr_t>(p.dsum) % 16 != 0)
    fail(strcat(op, ": lse and dsum must be 16-byte aligned"));
  Context& c = Context::get();
  const Plan& plan = c.plan(true, p);
  const float scale = 1.f / std::sqrt(static_cast<float>(p.hd));
  const float neg_inf = c.negative_infinity(), one = 1.f;
  void* accum = c.dq_accum(size_t(p.B) * p.H * p.T * p.hd * sizeof(float), stream);
  c.execute(plan, {kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum, kScale, kNegInf, kOne},
            {ptr(p.q.ptr), ptr(p.k.ptr), ptr(p.v.ptr), p.out.ptr, p.lse, ptr(p.dout.ptr), p.dq.ptr, p.dk.ptr,
             p.dv.ptr, p.dsum, accum, ptr(&scale), ptr(&neg_inf), ptr(&one)},
            stream);
}

}  // namespace

size_t library_version() { return api().cudnnGetVersion(); }

void check_attention_descriptors(int B, int T, int H, int KVH, int hd) {
  AttentionParams p;
  p.B = B, p.T = T, p.H = H, p.KVH = KVH, p.hd = hd;
  const int64_t q_row = int64_t(H) * hd, kv_row = int64_t(KVH) * hd;
  p.q.token_stride = p.out.token_stride = p.dout.token_stride = p.dq.token_stride = q_row;
  p.k.token_stride = p.v.token_stride = p.dk.token_stride = p.dv.token_stride = kv_row;
  p.q.head_stride = p.k.head_stride = p.v.head_stride = p.out.head_stride = hd;
  p.dout.head_stride = p.dq.head_stride = p.dk.head_stride = p.dv.head_stride = hd;
  for (const bool backward : {false, true}) {
    GraphBuilder g(nullptr);  // no operation graph is built: that needs a handle, and a handle a GPU
    if (backward)
      describe_backward(g, p);
    else
      describe_forward(g, p);
  }
}

}  // namespace lt::cudnn

LT_CUDA_NAMESPACE_BEGIN

void cudnn_attention_prepare() { cudnn::Context::get(); }
void cudnn_attention_forward(const AttentionParams& p, cudaStream_t stream) { cudnn::forward(p, stream); }
void cudnn_attention_backward(const AttentionParams& p, cudaStream_t stream) { cudnn::backward(p, stream); }

LT_CUDA_NAMESPACE_END
