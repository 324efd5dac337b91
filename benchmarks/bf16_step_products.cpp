// The bf16 path's matrix products at the shapes and layouts one training step runs them
// (Bf16Matmuls, src/backend/cpu/onednn/bf16_matmuls.cpp), each next to the plain oneDNN bf16 GEMM
// of the same M, N, K: why the products inside a step run below the isolated GEMM rate.
//
// Per product of a layer (x (N,IC), w (OC,IC), dout (N,OC); N tokens):
//   fwd  out (N,OC) = x w^T        gemm(no, trans)           K = IC
//   dX   dx (N,IC) = dout w        gemm(no, no)              K = OC
//   dW   dw (OC,IC) += dout^T x    gemm(trans, no, +=)       K = N
// Columns, GFLOP/s (2 M N K / time):
//   hot    the step's call, the same operands every repeat (they stay in cache)
//   cold   the step's call cycling over `layers` operand sets, as a step reaches each layer's
//          weights and activations once
//   +conv  cold, with the fp32 -> bf16 conversion of the activation operands the call converts
//          itself when no op wrote their bf16 copy (Bf16Matmuls::operand())
//   packed cold, with B (a weight: fwd and dX only) packed beforehand into the layout the kernel
//          reads (gemm_bf16_pack, once per weight and optimizer step); pack ms: that packing's cost
//          per step (fp32 -> packed bf16, one pass), not included in the column
//   plain  C (M,N) = A (M,K) B (K,N), no transposes, no accumulation, hot: the isolated GEMM rate
// Each figure is the best of `rounds` rounds; a round measures every column once, interleaved,
// so that other load on the machine falls on all of them alike.
//
// Usage: bf16_step_products [--dim 768] [--hidden 2048] [--vocab 32000] [--tokens 2048]
//                           [--layers 12] [--rounds 5] [--gflop 10 (work per hot/plain timing)]
// Threads: OMP_NUM_THREADS.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/aligned_allocator.h"
#include "backend/cpu/onednn/bf16.h"
#include "backend/cpu/onednn/matmul_onednn.h"

namespace {

using lt::cpu::AlignedVector;
using lt::cpu::bf16;
namespace dnn = lt::cpu::onednn;

struct Options {
  int dim = 768, hidden = 2048, vocab = 32000, tokens = 2048, layers = 12, rounds = 5;
  double gflop = 10;  // per hot or plain timing
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--dim") o.dim = v;
    else if (a == "--hidden") o.hidden = v;
    else if (a == "--vocab") o.vocab = v;
    else if (a == "--tokens") o.tokens = v;
    else if (a == "--layers") o.layers = v;
    else if (a == "--rounds") o.rounds = v;
    else if (a == "--gflop") o.gflop = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "bf16_step_products: unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One product kind of the step: C (M,N) = op(A) op(B) (+= C), A and B bf16, C fp32.
struct Product {
  std::string name;
  bool ta, tb, acc;
  int M, N, K, lda, ldb;
  size_t a_elems, b_elems;
  bool convert_a, convert_b;  // whether the step may convert that operand from fp32 itself
  int per_step;               // calls per step
};

// A linear layer (IC -> OC) over n tokens: its forward, dX and dW products as Bf16Matmuls calls them.
// conv_x / conv_dout: whether that activation has no fused bf16 copy in the step.
void add_linear(std::vector<Product>& ps, const char* name, int n, int IC, int OC, int count, bool conv_x,
                bool conv_dout) {
  const size_t x = size_t(n) * IC, w = size_t(OC) * IC, g = size_t(n) * OC;
  ps.push_back({std::string(name) + " fwd", false, true, false, n, OC, IC, IC, IC, x, w, conv_x, false, count});
  ps.push_back({std::string(name) + " dX", false, false, false, n, IC, OC, OC, IC, g, w, conv_dout, false, count});
  ps.push_back({std::string(name) + " dW", true, false, true, OC, IC, n, OC, IC, g, x, conv_dout, conv_x, count});
}

// The products of one stories-shaped step. What the step converts (ops_bf16.h, bf16_matmuls.h):
// RMSNorm writes xn's copy, SwiGLU forward its output's, SwiGLU backward dh1/dh3 and the
// cross-entropy dlogits in bf16 only; the attention output and the residual gradient (dout of wo
// and w2) are converted on first use.
std::vector<Product> step_products(const Options& o) {
  std::vector<Product> ps;
  const int n = o.tokens, d = o.dim, h = o.hidden, L = o.layers;
  add_linear(ps, "wq|wk|wv", n, d, d, 3 * L, false, false);
  add_linear(ps, "wo", n, d, d, L, true, true);
  add_linear(ps, "w1|w3", n, d, h, 2 * L, false, false);
  add_linear(ps, "w2", n, h, d, L, false, true);
  add_linear(ps, "head", n, d, o.vocab, 1, false, false);
  return ps;
}

void fill(AlignedVector<bf16>& v, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& e : v) e = lt::cpu::float_to_bf16(u(rng));
}

// Operand sets for one product: `sets` distinct (A, B, C) and fp32 sources of A and B.
struct Operands {
  std::vector<AlignedVector<bf16>> a, b;
  std::vector<AlignedVector<float>> c, a32, b32, w32;  // w32: the fp32 weight a packed B is made of
  std::vector<AlignedVector<bf16>> packed;
};

bool packable(const Product& p) { return !p.ta; }  // B is the weight w (fwd: w^T, dX: w)

// Packs every set's weight; returns seconds per packing.
double pack_all(const Product& p, Operands& op) {
  const double t0 = now_s();
  for (size_t s = 0; s < op.packed.size(); ++s)
    lt::cpu::onednn::gemm_bf16_pack(op.packed[s].data(), p.tb, p.M, p.N, p.K, op.w32[s].data(), p.ldb, false);
  return (now_s() - t0) / double(op.packed.size());
}

double time_packed(const Product& p, const Operands& op) {
  const double t0 = now_s();
  for (size_t s = 0; s < op.packed.size(); ++s)
    lt::cpu::onednn::gemm_bf16_packed(p.M, p.N, p.K, op.a[s].data(), op.packed[s].data(),
                                      const_cast<float*>(op.c[s].data()));
  return (now_s() - t0) / double(op.packed.size());
}

Operands make_operands(const Product& p, int sets, std::mt19937& rng) {
  Operands op;
  for (int s = 0; s < sets; ++s) {
    op.a.emplace_back(p.a_elems), op.b.emplace_back(p.b_elems);
    op.c.emplace_back(size_t(p.M) * p.N, 0.f);
    fill(op.a.back(), rng), fill(op.b.back(), rng);
    op.a32.emplace_back(p.convert_a ? p.a_elems : 0, 0.5f);
    op.b32.emplace_back(p.convert_b ? p.b_elems : 0, 0.5f);
    if (packable(p)) {
      op.w32.emplace_back(p.b_elems);
      for (size_t i = 0; i < p.b_elems; ++i) op.w32.back()[i] = lt::cpu::bf16_to_float(op.b.back()[i]);
      op.packed.emplace_back(lt::cpu::onednn::gemm_bf16_packed_bytes(p.M, p.N, p.K, false) / sizeof(bf16) + 1);
    }
  }
  return op;
}

void call(const Product& p, const Operands& op, int s) {
  dnn::gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, op.a[s].data(), p.lda, op.b[s].data(), p.ldb, p.acc,
                 const_cast<float*>(op.c[s].data()), p.N);
}

// Seconds per call: one call on set 0 (hot: `reps` times) or one per set (cold), optionally converting.
double time_step_call(const Product& p, Operands& op, bool cold, bool convert, int reps) {
  const int sets = cold ? int(op.a.size()) : 1;
  const double t0 = now_s();
  for (int r = 0; r < (cold ? 1 : reps); ++r)
    for (int s = 0; s < sets; ++s) {
      if (convert && p.convert_a) lt::cpu::convert_to_bf16(op.a[s].data(), op.a32[s].data(), p.a_elems);
      if (convert && p.convert_b) lt::cpu::convert_to_bf16(op.b[s].data(), op.b32[s].data(), p.b_elems);
      call(p, op, s);
    }
  return (now_s() - t0) / (cold ? sets : reps);
}

double time_plain(const Product& p, const Operands& op, AlignedVector<bf16>& a, AlignedVector<bf16>& b, int reps) {
  const double t0 = now_s();
  for (int r = 0; r < reps; ++r)
    dnn::gemm_bf16(false, false, p.M, p.N, p.K, a.data(), p.K, b.data(), p.N, false,
                   const_cast<float*>(op.c[0].data()), p.N);
  return (now_s() - t0) / reps;
}

// The step call against a double-precision product of the same bf16 inputs on a few entries.
double check(const Product& p, Operands& op, std::mt19937& rng) {
  std::fill(op.c[0].begin(), op.c[0].end(), 0.f);
  call(p, op, 0);
  AlignedVector<float> packed_c(packable(p) ? op.c[0].size() : 0);
  double worst = 0;
  for (int t = 0; t < 32; ++t) {
    const int i = int(rng() % unsigned(p.M)), j = int(rng() % unsigned(p.N));
    double ref = 0, mag = 0;
    for (int k = 0; k < p.K; ++k) {
      const double a = lt::cpu::bf16_to_float(op.a[0][p.ta ? size_t(k) * p.lda + i : size_t(i) * p.lda + k]);
      const double b = lt::cpu::bf16_to_float(op.b[0][p.tb ? size_t(j) * p.ldb + k : size_t(k) * p.ldb + j]);
      ref += a * b, mag += std::fabs(a * b);
    }
    worst = std::max(worst, std::fabs(op.c[0][size_t(i) * p.N + j] - ref) / mag);
    if (!packable(p)) continue;
    if (t == 0) {
      pack_all(p, op);
      std::fill(packed_c.begin(), packed_c.end(), 0.f);
      lt::cpu::onednn::gemm_bf16_packed(p.M, p.N, p.K, op.a[0].data(), op.packed[0].data(), packed_c.data());
    }
    worst = std::max(worst, std::fabs(packed_c[size_t(i) * p.N + j] - ref) / mag);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const unsigned seed = 19;
  std::mt19937 rng(seed);
  std::printf("bf16_step_products: dim %d hidden %d vocab %d tokens %d layers %d, %d threads, best of %d, seed %u\n",
              o.dim, o.hidden, o.vocab, o.tokens, o.layers, omp_get_max_threads(), o.rounds, seed);
  std::printf("%-14s %6s %6s %6s %-5s %-26s %7s %7s %7s %7s %7s %9s %9s %9s\n", "product", "M", "N", "K", "op", "impl",
              "hot", "cold", "+conv", "packed", "plain", "check", "ms/step", "pack ms");
  double total_ms = 0, total_plain_ms = 0, flop = 0;
  for (const Product& p : step_products(o)) {
    const int sets = p.name == "head" ? 1 : std::max(1, std::min(o.layers, p.per_step));
    Operands op = make_operands(p, sets, rng);
    AlignedVector<bf16> pa(size_t(p.M) * p.K), pb(size_t(p.K) * p.N);
    fill(pa, rng), fill(pb, rng);
    const double err = check(p, op, rng);
    const std::string impl = dnn::gemm_bf16_last_impl();
    const int reps = std::max(1, int(o.gflop * 1e9 / (2.0 * p.M * p.N * p.K)));
    double hot = 1e30, cold = 1e30, conv = 1e30, plain = 1e30, packed = 1e30, pack = 1e30;
    time_plain(p, op, pa, pb, 1);
    for (int r = 0; r < o.rounds; ++r) {
      hot = std::min(hot, time_step_call(p, op, false, false, reps));
      cold = std::min(cold, time_step_call(p, op, true, false, reps));
      conv = std::min(conv, time_step_call(p, op, true, true, reps));
      plain = std::min(plain, time_plain(p, op, pa, pb, reps));
      if (!packable(p)) continue;
      pack = std::min(pack, pack_all(p, op));
      packed = std::min(packed, time_packed(p, op));
    }
    const double f = 2.0 * p.M * p.N * p.K;
    const char* ops = p.ta ? "T,N" : p.tb ? "N,T" : "N,N";
    std::printf("%-14s %6d %6d %6d %-5s %-26s %7.0f %7.0f %7.0f %7.0f %7.0f %9.1e %9.1f %9.1f\n", p.name.c_str(), p.M,
                p.N, p.K, ops, impl.c_str(), f / hot / 1e9, f / cold / 1e9, f / conv / 1e9,
                packable(p) ? f / packed / 1e9 : 0.0, f / plain / 1e9, err, conv * 1e3 * p.per_step,
                packable(p) ? pack * 1e3 * p.per_step : 0.0);
    if (err > 1e-2) {
      std::fprintf(stderr, "bf16_step_products: %s differs from the fp64 product (%.2e > 1e-2)\n", p.name.c_str(), err);
      return 1;
    }
    total_ms += conv * 1e3 * p.per_step, total_plain_ms += plain * 1e3 * p.per_step, flop += f * p.per_step;
  }
  std::printf("step products: %.0f ms as the step calls them (+conv), %.0f ms at the plain GEMM rate; %.2f TFLOP, "
              "%.0f GFLOP/s against %.0f\n",
              total_ms, total_plain_ms, flop / 1e12, flop / total_ms / 1e6, flop / total_plain_ms / 1e6);
  return 0;
}
