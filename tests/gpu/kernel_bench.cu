// Kernel benchmarks on Llama-2-7b shapes (C = 4096, H = KVH = 32, hd = 128, F = 11008, V = 32000;
// N = B*T = 2*4096 = 8192 tokens), each next to the limit it is measured against (STYLE.md):
// * memory-bound kernels: GB/s of their compulsory traffic (every input read once, every output
//   written once; += outputs read and written; scratch not counted) against the measured
//   device-to-device cudaMemcpy bandwidth (1 GiB copy, counted as 2 GiB moved: read + write);
// * attention: TFLOP/s against the measured cuBLAS bf16 GEMM rate (cublasGemmEx, bf16 in and out,
//   fp32 accumulate, 8192^3) and against the device's datasheet dense bf16 peak (gpu_spec.h; "-"
//   for a GPU not in the table), ours next to cuDNN's fused attention (cudnn_sdpa_*) on the same
//   tensors. Causal FLOPs count only the lower triangle, diagonal included:
//   pairs = B * H * T(T+1)/2; forward 4 hd per pair (QK^T and PV, 2 flops per multiply-add);
//   backward 10 hd per pair (5 matmuls: S recomputed, dP = dO V^T, dV = P^T dO, dQ = dS K,
//   dK = dS^T Q; 2.5x forward, the flash-attention convention).
// Every timing: warm-up calls, then the median of `reps` cudaEvent-timed calls.
#include <cstdio>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.cuh"
#include "attention_decode.cuh"
#include "backend/cuda/cudnn_attention.h"
#include "crossentropy.cuh"
#include "embedding.cuh"
#include "gpu_check_util.cuh"
#include "llamatrain/gpu_spec.h"
#include "optimizer.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"

namespace lt::gpucheck {
namespace {

using Bf16 = __nv_bfloat16;

// Llama-2-7b.
constexpr int kB = 2, kT = 4096, kN = kB * kT, kC = 4096, kH = 32, kKVH = 32, kHd = 128, kF = 11008, kV = 32000;
constexpr size_t kShard = size_t{1} << 28;  // fp32 optimizer shard: 268M parameters (~1/25 of 7B)

// Deterministic pseudo-random fill on the device (a hash of the index): benchmark inputs need
// realistic values (zeros would make GEMMs and exps unrealistically cheap), not a distribution.
__device__ float hash_uniform(size_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed * 0x85EBCA77u;
  h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
  return (h >> 8) * (1.0f / 16777216.0f);
}
__global__ void fill_bf16_kernel(Bf16* x, size_t n, float lo, float hi, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    x[i] = __float2bfloat16(lo + (hi - lo) * hash_uniform(i, seed));
}
__global__ void fill_f32_kernel(float* x, size_t n, float lo, float hi, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    x[i] = lo + (hi - lo) * hash_uniform(i, seed);
}
void fill(DeviceBuffer<Bf16>& b, float lo, float hi, uint32_t seed) {
  fill_bf16_kernel<<<1024, 256>>>(b.get(), b.size(), lo, hi, seed);
  LT_GPUCHECK_CUDA(cudaGetLastError());
}
void fill(DeviceBuffer<float>& b, float lo, float hi, uint32_t seed) {
  fill_f32_kernel<<<1024, 256>>>(b.get(), b.size(), lo, hi, seed);
  LT_GPUCHECK_CUDA(cudaGetLastError());
}

struct Row {
  std::string kernel, shape;
  double ms = 0, bytes = 0, flops = 0;  // bytes 0: not memory-bound; flops 0: not counted
};

// What the rows are measured against: the measured copy bandwidth and GEMM rate, and the
// datasheet's dense bf16 peak (0: a GPU not in gpu_spec.h's table).
struct Limits {
  double copy_gbs = 0, gemm_tflops = 0, peak_tflops = 0;
};

std::string format_row(const Row& r, const Limits& limits, bool markdown);

// Times the rows of the benchmark families; each row is printed, and appended to the Markdown table,
// the moment it is measured, so a run that dies later keeps it.
class Bench {
 public:
  Bench(const BenchOptions& o, const Limits& limits, FILE* md) : opt_(o), limits_(limits), md_(md) {}
  template <class F>
  void run(const std::string& kernel, const std::string& shape, double bytes, double flops, F&& fn) {
    const double ms = median_ms(fn, opt_.warmup, opt_.reps);
    add({kernel, shape, ms, bytes, flops});
  }
  void add(const Row& r) {
    rows_.push_back(r);
    std::printf("  %s\n", format_row(r, limits_, false).c_str());
    std::fflush(stdout);
    if (md_) std::fprintf(md_, "%s\n", format_row(r, limits_, true).c_str()), std::fflush(md_);
  }
  // This process's row for (kernel, shape), or null (measured before a restart, or not at all).
  const Row* find(const std::string& kernel, const std::string& shape) const {
    for (const Row& r : rows_)
      if (r.kernel == kernel && r.shape == shape) return &r;
    return nullptr;
  }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  BenchOptions opt_;
  Limits limits_;
  FILE* md_;
  std::vector<Row> rows_;
};

std::string shape_nc(int N, int C) { return format("N=%d C=%d", N, C); }

void bench_rmsnorm(Bench& b) {
  DeviceBuffer<Bf16> x(size_t{kN} * kC), out(x.size()), w(kC), g(x.size()), dx(x.size());
  DeviceBuffer<float> rstd(kN), dw(kC), scratch(cuda::rmsnorm_backward_scratch_floats(kN, kC));
  fill(x, -2, 2, 1), fill(w, 0.5, 1.5, 2), fill(g, -1, 1, 3), fill(dw, 0, 0, 4);
  cuda::RmsnormForwardParams f;
  f.out = out.get(), f.rstd = rstd.get(), f.x = x.get(), f.weight = w.get(), f.N = kN, f.C = kC;
  f.x_row_stride = f.out_row_stride = kC;
  const double nc2 = 2.0 * kN * kC;
  b.run("rmsnorm_forward", shape_nc(kN, kC), 2 * nc2 + 2.0 * kC + 4.0 * kN, 0,
        [&] { cuda::rmsnorm_forward_cuda(f, nullptr); });
  cuda::RmsnormBackwardParams p;
  p.dx = dx.get(), p.dweight = dw.get(), p.scratch = scratch.get(), p.dout = g.get(), p.x = x.get();
  p.weight = w.get(), p.rstd = rstd.get(), p.N = kN, p.C = kC;
  p.dx_row_stride = p.dout_row_stride = p.x_row_stride = kC;
  b.run("rmsnorm_backward", shape_nc(kN, kC), 3 * nc2 + 2.0 * kC + 4.0 * kN + 8.0 * kC, 0,
        [&] { cuda::rmsnorm_backward_cuda(p, nullptr); });
}

void bench_rope(Bench& b) {
  const size_t n = size_t{kN} * kH * kHd;
  DeviceBuffer<Bf16> q(n), k(n), oq(n), ok(n);
  fill(q, -1, 1, 5), fill(k, -1, 1, 6);
  std::vector<int32_t> pos_h(kN);
  for (int i = 0; i < kN; ++i) pos_h[i] = i % kT;
  DeviceBuffer<int32_t> pos(pos_h);
  cuda::RopeParams p;
  p.q = {oq.get(), q.get(), kH, kH * kHd, kHd, kH * kHd, kHd};
  p.k = {ok.get(), k.get(), kKVH, kKVH * kHd, kHd, kKVH * kHd, kHd};
  p.pos = pos.get(), p.B = kB, p.T = kT, p.hd = kHd;
  const std::string shape = format("B=%d T=%d q,k %dx%d", kB, kT, kH, kHd);
  const double bytes = 2.0 * 2.0 * (n + size_t{kN} * kKVH * kHd) + 4.0 * kN;
  b.run("rope_forward", shape, bytes, 0, [&] { cuda::rope_forward_cuda(p, nullptr); });
  b.run("rope_backward", shape, bytes, 0, [&] { cuda::rope_backward_cuda(p, nullptr); });
}

void bench_swiglu(Bench& b) {
  const size_t n = size_t{kN} * kF;
  DeviceBuffer<Bf16> h1(n), h3(n), out(n), dh1(n), dh3(n);
  fill(h1, -4, 4, 7), fill(h3, -1, 1, 8);
  cuda::SwigluForwardParams f;
  f.out = out.get(), f.h1 = h1.get(), f.h3 = h3.get(), f.N = kN, f.F = kF;
  f.out_row_stride = f.h1_row_stride = f.h3_row_stride = kF;
  b.run("swiglu_forward", format("N=%d F=%d", kN, kF), 3 * 2.0 * n, 0, [&] { cuda::swiglu_forward_cuda(f, nullptr); });
  cuda::SwigluBackwardParams p;
  p.dh1 = dh1.get(), p.dh3 = dh3.get(), p.dout = out.get(), p.h1 = h1.get(), p.h3 = h3.get(), p.N = kN, p.F = kF;
  p.dh1_row_stride = p.dh3_row_stride = p.dout_row_stride = p.h1_row_stride = p.h3_row_stride = kF;
  b.run("swiglu_backward", format("N=%d F=%d", kN, kF), 5 * 2.0 * n, 0, [&] { cuda::swiglu_backward_cuda(p, nullptr); });
}

void bench_embedding(Bench& b) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> id(0, kV - 1);
  std::vector<int32_t> tok_h(kN);
  for (auto& t : tok_h) t = id(rng);
  const cuda::EmbeddingBackwardPlan plan = cuda::embedding_backward_plan(tok_h.data(), kN, kV);
  DeviceBuffer<int32_t> tok(tok_h), d_plan(plan.data);
  DeviceBuffer<Bf16> wte(size_t{kV} * kC), out(size_t{kN} * kC);
  DeviceBuffer<float> dwte(size_t{kV} * kC);
  fill(wte, -1, 1, 9), fill(dwte, 0, 0, 10);
  cuda::EmbeddingForwardParams f;
  f.out = out.get(), f.tokens = tok.get(), f.wte = wte.get(), f.N = kN, f.C = kC;
  f.out_row_stride = f.wte_row_stride = kC;
  const std::string shape = format("N=%d V=%d C=%d", kN, kV, kC);
  b.run("embedding_forward", shape, 2 * 2.0 * kN * kC + 4.0 * kN, 0, [&] { cuda::embedding_forward_cuda(f, nullptr); });
  cuda::EmbeddingBackwardParams p;
  p.dwte = dwte.get(), p.dout = out.get(), p.plan = d_plan.get(), p.n_rows = plan.n_rows, p.N = kN, p.C = kC;
  p.dwte_row_stride = p.dout_row_stride = kC;
  b.run("embedding_backward", shape + format(" (%d ids)", plan.n_rows),
        2.0 * kN * kC + 2 * 4.0 * plan.n_rows * kC + 4.0 * plan.data.size(), 0,
        [&] { cuda::embedding_backward_cuda(p, nullptr); });
}

void bench_crossentropy(Bench& b) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int32_t> id(0, kV - 1);
  std::vector<int32_t> t_h(kN);
  std::vector<uint8_t> m_h(kN, 1);
  for (auto& t : t_h) t = id(rng);
  DeviceBuffer<int32_t> targets(t_h);
  DeviceBuffer<uint8_t> mask(m_h);
  DeviceBuffer<Bf16> logits(size_t{kN} * kV), dlogits(logits.size());
  DeviceBuffer<float> losses(kN), lse(kN);
  DeviceBuffer<double> sum(1);
  fill(logits, -8, 8, 13);
  cuda::CrossentropyForwardParams f;
  f.losses = losses.get(), f.lse = lse.get(), f.loss_sum = sum.get(), f.logits = logits.get();
  f.targets = targets.get(), f.mask = mask.get(), f.N = kN, f.V = kV, f.logits_row_stride = kV;
  const double nv2 = 2.0 * kN * kV;
  b.run("crossentropy_forward", format("N=%d V=%d", kN, kV), nv2 + 13.0 * kN, 0,
        [&] { cuda::crossentropy_forward_cuda(f, nullptr); });
  cuda::CrossentropyBackwardParams p;
  p.dlogits = dlogits.get(), p.logits = logits.get(), p.lse = lse.get(), p.targets = targets.get(), p.mask = mask.get();
  p.dloss = 1.0f / kN, p.N = kN, p.V = kV, p.dlogits_row_stride = p.logits_row_stride = kV;
  b.run("crossentropy_backward", format("N=%d V=%d", kN, kV), 2 * nv2 + 9.0 * kN, 0,
        [&] { cuda::crossentropy_backward_cuda(p, nullptr); });
}

// Llama-2-7b attention tensors for B x T tokens, filled.
struct AttentionTensors {
  DeviceBuffer<Bf16> q, k, v, out, dout, dq, dk, dv;
  DeviceBuffer<float> lse, dsum;
  cuda::AttentionParams p;
  double pairs;  // causal (query, key) pairs, diagonal included
  std::string shape;
  AttentionTensors(int B, int T)
      : q(size_t(B) * T * kH * kHd), k(size_t(B) * T * kKVH * kHd), v(k.size()), out(q.size()), dout(q.size()),
        dq(q.size()), dk(k.size()), dv(k.size()), lse(size_t(B) * T * kH), dsum(lse.size()) {
    fill(q, -1, 1, 14), fill(k, -1, 1, 15), fill(v, -1, 1, 16), fill(dout, -1, 1, 17);
    const int64_t ts = int64_t{kH} * kHd, kts = int64_t{kKVH} * kHd;
    p.out = {out.get(), ts, kHd}, p.lse = lse.get();
    p.q = {q.get(), ts, kHd}, p.k = {k.get(), kts, kHd}, p.v = {v.get(), kts, kHd};
    p.dout = {dout.get(), ts, kHd}, p.dq = {dq.get(), ts, kHd}, p.dk = {dk.get(), kts, kHd}, p.dv = {dv.get(), kts, kHd};
    p.dsum = dsum.get(), p.B = B, p.T = T, p.H = kH, p.KVH = kKVH, p.hd = kHd;
    pairs = double(B) * kH * (double(T) * (T + 1) / 2);
    shape = format("B=%d T=%d H=%d KVH=%d hd=%d", B, T, kH, kKVH, kHd);
  }
};

void bench_attention(Bench& b, int B, int T) {
  AttentionTensors t(B, T);
  b.run("attention_forward", t.shape, 0, 4.0 * kHd * t.pairs, [&] { cuda::attention_forward_cuda(t.p, nullptr); });
  b.run("attention_backward", t.shape, 0, 10.0 * kHd * t.pairs, [&] { cuda::attention_backward_cuda(t.p, nullptr); });
}

// Decoding one token of Llama-2-7b against n cached positions (generate's kernel): it reads the
// layer's whole key and value cache once, so GB/s against the copy bandwidth is its measure.
void bench_attention_decode(Bench& b, int n) {
  const size_t cache = size_t(n) * kKVH * kHd;
  DeviceBuffer<Bf16> q(size_t{kH} * kHd), k(cache), v(cache), out(q.size());
  fill(q, -1, 1, 18), fill(k, -1, 1, 19), fill(v, -1, 1, 20);
  cuda::AttentionDecodeParams p;
  p.out = out.get(), p.q = q.get(), p.k = k.get(), p.v = v.get(), p.kv_stride = int64_t{kKVH} * kHd;
  p.n = n, p.H = kH, p.KVH = kKVH, p.hd = kHd;
  b.run("attention_decode", format("n=%d H=%d KVH=%d hd=%d", n, kH, kKVH, kHd), 2.0 * (2.0 * cache + 2.0 * q.size()), 0,
        [&] { cuda::attention_decode_cuda(p, nullptr); });
}

// The yardstick: cuDNN's fused attention on the same tensors (its first call builds the graph; the
// warm-up calls absorb that), after all of ours. Skipped with the reason when cuDNN is absent, has
// no engine or fails: cuDNN's failure, not ours.
void bench_cudnn_attention(Bench& b, int B, int T) {
  AttentionTensors t(B, T);
  try {
    b.run("cudnn_sdpa_forward", t.shape, 0, 4.0 * kHd * t.pairs, [&] { cuda::cudnn_attention_forward(t.p, nullptr); });
    b.run("cudnn_sdpa_backward", t.shape, 0, 10.0 * kHd * t.pairs, [&] { cuda::cudnn_attention_backward(t.p, nullptr); });
  } catch (const std::exception& e) {
    if (cudaDeviceSynchronize() != cudaSuccess) throw;  // sticky: run_kernel_benchmarks names the family
    std::printf("  SKIP cudnn_sdpa at T=%d: %s\n", T, e.what());
    return;
  }
  const Row *of = b.find("attention_forward", t.shape), *ob = b.find("attention_backward", t.shape);
  const Row *cf = b.find("cudnn_sdpa_forward", t.shape), *cb = b.find("cudnn_sdpa_backward", t.shape);
  if (of && ob && cf && cb)
    std::printf("  ours / cuDNN time at T=%d: forward %.2f, backward %.2f (below 1: ours is faster)\n", T,
                of->ms / cf->ms, ob->ms / cb->ms);
}

void bench_optimizer(Bench& b) {
  const size_t n = kShard;
  DeviceBuffer<float> param(n), m(n), v(n), grad(n);
  DeviceBuffer<Bf16> pbf(n);
  DeviceBuffer<double> scratch(cuda::sum_squares_scratch_doubles(n)), out(1);
  fill(param, -1, 1, 18), fill(m, 0, 0, 19), fill(v, 0, 0, 20), fill(grad, -1e-2f, 1e-2f, 21);
  const std::string shape = format("n=%zu fp32", n);
  int t = 0;
  b.run("adamw_update", shape + " (+bf16 copy)", 30.0 * n, 0, [&] {
    cuda::AdamwParams p;
    p.param = param.get(), p.m = m.get(), p.v = v.get(), p.grad = grad.get(), p.param_bf16 = pbf.get();
    p.n = n, p.lr = 1e-4f, p.weight_decay = 0.1f, p.t = ++t;
    cuda::adamw_update_cuda(p, nullptr);
  });
  b.run("sum_squares", shape, 4.0 * n, 0, [&] { cuda::sum_squares_cuda(out.get(), grad.get(), n, scratch.get(), nullptr); });
  b.run("scale_inplace", shape, 8.0 * n, 0, [&] { cuda::scale_inplace_cuda(grad.get(), 0.999f, n, nullptr); });
  b.run("cast_f32_to_bf16", shape, 6.0 * n, 0, [&] { cuda::cast_f32_to_bf16_cuda(pbf.get(), param.get(), n, nullptr); });
}

// The two limits: device-to-device copy bandwidth and the cuBLAS bf16 GEMM rate.
double measure_copy_gbs(const BenchOptions& opt, Row& row) {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer<unsigned char> src(bytes), dst(bytes);
  LT_GPUCHECK_CUDA(cudaMemset(src.get(), 1, bytes));
  row = {"cudaMemcpy D2D", "1 GiB (read + write)", 0, 2.0 * bytes, 0};
  row.ms = median_ms([&] { LT_GPUCHECK_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr)); },
                     opt.warmup, opt.reps);
  return row.bytes / (row.ms * 1e-3) / 1e9;
}

double measure_gemm_tflops(const BenchOptions& opt, Row& row) {
  const int n = 8192;
  DeviceBuffer<Bf16> a(size_t{n} * n), bm(size_t{n} * n), c(size_t{n} * n);
  fill(a, -1, 1, 22), fill(bm, -1, 1, 23);
  cublasHandle_t handle;
  LT_GPUCHECK_CUBLAS(cublasCreate(&handle));
  const float alpha = 1.f, beta = 0.f;
  row = {"cuBLAS GEMM bf16", "8192^3, fp32 accumulate", 0, 0, 2.0 * n * n * double(n)};
  try {
    row.ms = median_ms(
        [&] {
          LT_GPUCHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                       bm.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
        },
        opt.warmup, opt.reps);
  } catch (...) {
    cublasDestroy(handle);
    throw;
  }
  LT_GPUCHECK_CUBLAS(cublasDestroy(handle));
  return row.flops / (row.ms * 1e-3) / 1e12;
}

// One row of the table: console columns, or a Markdown table row.
std::string format_row(const Row& r, const Limits& limits, bool markdown) {
  const double s = r.ms * 1e-3, tflops = r.flops / s / 1e12;
  const std::string gbs = r.bytes > 0 ? format("%.0f", r.bytes / s / 1e9) : "-";
  const std::string pbw = r.bytes > 0 ? format("%.1f", 100.0 * r.bytes / s / 1e9 / limits.copy_gbs) : "-";
  const std::string tf = r.flops > 0 ? format("%.1f", tflops) : "-";
  const std::string pg = r.flops > 0 ? format("%.1f", 100.0 * tflops / limits.gemm_tflops) : "-";
  const std::string pp = r.flops > 0 && limits.peak_tflops > 0 ? format("%.1f", 100.0 * tflops / limits.peak_tflops) : "-";
  if (markdown)
    return format("| %s | %s | %.3f | %s | %s | %s | %s | %s |", r.kernel.c_str(), r.shape.c_str(), r.ms, gbs.c_str(),
                  pbw.c_str(), tf.c_str(), pg.c_str(), pp.c_str());
  return format("%-22s %-38s %9.3f %9s %8s %9s %8s %8s", r.kernel.c_str(), r.shape.c_str(), r.ms, gbs.c_str(),
                pbw.c_str(), tf.c_str(), pg.c_str(), pp.c_str());
}

// The datasheet's dense bf16 peak of device 0 (0 if gpu_spec.h does not know it), printed.
double datasheet_peak_tflops() {
  cudaDeviceProp prop{};
  LT_GPUCHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const GpuSpec* spec = gpu_spec_for_device(prop.name, double(prop.totalGlobalMem));
  if (spec)
    std::printf("  datasheet dense bf16 peak: %.0f TFLOP/s (%s, as %s)\n", spec->bf16_tflops, prop.name,
                spec->name.c_str());
  else
    std::printf("  datasheet dense bf16 peak: unknown for %s (not in gpu_spec.h's table)\n", prop.name);
  return spec ? spec->bf16_tflops : 0.0;
}

struct BenchFamily {
  const char* name;
  void (*fn)(Bench&);
};
const std::vector<BenchFamily>& bench_families() {
  static const std::vector<BenchFamily> kFamilies = {
      {"rmsnorm", bench_rmsnorm},
      {"rope", bench_rope},
      {"swiglu", bench_swiglu},
      {"embedding", bench_embedding},
      {"crossentropy", bench_crossentropy},
      {"attention_T512", [](Bench& b) { bench_attention(b, 16, 512); }},
      {"attention_T2048", [](Bench& b) { bench_attention(b, 2, 2048); }},
      {"attention_T4096", [](Bench& b) { bench_attention(b, kB, kT); }},
      {"optimizer", bench_optimizer},
      {"attention_decode", [](Bench& b) { bench_attention_decode(b, 512), bench_attention_decode(b, kT); }},
      {"cudnn_sdpa_T512", [](Bench& b) { bench_cudnn_attention(b, 16, 512); }},
      {"cudnn_sdpa_T2048", [](Bench& b) { bench_cudnn_attention(b, 2, 2048); }},
      {"cudnn_sdpa_T4096", [](Bench& b) { bench_cudnn_attention(b, kB, kT); }},
  };
  return kFamilies;
}

}  // namespace

std::vector<std::string> kernel_bench_names() {
  std::vector<std::string> names;
  for (const BenchFamily& f : bench_families()) names.push_back(f.name);
  return names;
}

int run_kernel_benchmarks(const BenchOptions& opt) {
  const auto& families = bench_families();
  const size_t first = index_after(kernel_bench_names(), opt.after, "--bench-after");
  std::printf("== benchmarks (Llama-2-7b shapes; warm-up %d, median of %d)%s\n", opt.warmup, opt.reps,
              opt.after.empty() ? "" : (" after " + opt.after).c_str());
  // Appended to: a restart after a sticky error adds its rows to the same table.
  FILE* md = opt.table_path ? std::fopen(opt.table_path, "a") : nullptr;
  if (opt.table_path && !md) std::printf("warning: cannot write %s\n", opt.table_path);
  const bool new_table = md && std::fseek(md, 0, SEEK_END) == 0 && std::ftell(md) == 0;
  Row copy, gemm;
  Limits limits;
  limits.copy_gbs = measure_copy_gbs(opt, copy);
  std::printf("  measured device-to-device copy: %.0f GB/s\n", limits.copy_gbs);
  limits.gemm_tflops = measure_gemm_tflops(opt, gemm);
  std::printf("  measured cuBLAS bf16 GEMM: %.1f TFLOP/s\n", limits.gemm_tflops);
  limits.peak_tflops = datasheet_peak_tflops();
  if (new_table) {
    std::fprintf(md, "| kernel | shape | ms | GB/s | %% of copy BW | TFLOP/s | %% of GEMM | %% of dense peak |\n");
    std::fprintf(md, "|---|---|---:|---:|---:|---:|---:|---:|\n");
  }
  // The yardsticks' rows head a new table; a restart measures them again for its percentages only.
  Bench yardsticks(opt, limits, new_table ? md : nullptr);
  yardsticks.add(copy), yardsticks.add(gemm);
  Bench bench(opt, limits, md);
  int errors = 0;
  for (size_t i = first; i < families.size(); ++i) {
    try {
      families[i].fn(bench);
    } catch (const std::exception& e) {
      const cudaError_t sticky = cudaDeviceSynchronize();
      if (sticky != cudaSuccess) {
        if (md) std::fclose(md);
        throw StickyError(families[i].name, std::string("sticky CUDA error in benchmark ") + families[i].name + ": " +
                                                cudaGetErrorString(sticky));
      }
      std::printf("  ERROR in benchmark %s: %s\n", families[i].name, e.what());
      ++errors;
    }
  }
  if (md) std::fclose(md);
  std::printf("\n%-22s %-38s %9s %9s %8s %9s %8s %8s\n", "kernel", "shape", "ms", "GB/s", "%copyBW", "TFLOP/s", "%GEMM",
              "%peak");
  for (const Bench* part : {&yardsticks, &bench})
    for (const Row& r : part->rows()) std::printf("%s\n", format_row(r, limits, false).c_str());
  std::printf("\nGB/s: compulsory bytes (inputs read once, outputs written once, += outputs both) / median time;\n"
              "%%copyBW: of the measured cudaMemcpy D2D rate (2 x 1 GiB / time). TFLOP/s (attention, causal):\n"
              "forward 4*hd*B*H*T(T+1)/2, backward 10*hd*B*H*T(T+1)/2; %%GEMM: of the measured cuBLAS bf16 rate;\n"
              "%%peak: of the datasheet's dense bf16 peak.\n");
  return errors;
}

}  // namespace lt::gpucheck
