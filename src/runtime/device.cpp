// The device registry (see device.h).
#include "llamatrain/device.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "backend/cpu/onednn/matmul_onednn.h"
#include "llamatrain/engine.h"
#include "llamatrain/inference.h"
#include "llamatrain/error.h"
#include "llamatrain/ops_cpu.h"

namespace lt {
namespace {

std::vector<DeviceBackend>& registry() {
  static std::vector<DeviceBackend> r;
  return r;
}

const DeviceBackend* find(DeviceKind kind) {
  for (const auto& b : registry())
    if (b.kind == kind) return &b;
  return nullptr;
}

}  // namespace

const char* device_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda";
    case DeviceKind::cuda_sim: return "cuda-sim";
  }
  return "?";
}

DeviceCallCounts DeviceCallCounts::from_values(const double* v) {
  DeviceCallCounts c;
  c.allocs = v[0], c.frees = v[1], c.device_syncs = v[2], c.stream_syncs = v[3];
  c.h2d_copies = v[4], c.d2h_copies = v[5], c.blocking_copies = v[6], c.plans_built = v[7];
  return c;
}

const char* const* DeviceCallCounts::names() {
  static const char* const n[kFields] = {"allocs",     "frees",      "device_syncs",    "stream_syncs",
                                         "h2d_copies", "d2h_copies", "blocking_copies", "plans_built"};
  return n;
}

DeviceCallCounts DeviceCallCounts::operator-(const DeviceCallCounts& o) const {
  const std::vector<double> a = values(), b = o.values();
  double d[kFields];
  for (int i = 0; i < kFields; ++i) d[i] = a[size_t(i)] - b[size_t(i)];
  return from_values(d);
}

void register_device_backend(const DeviceBackend& backend) {
  for (auto& b : registry())
    if (b.kind == backend.kind) {
      b = backend;
      return;
    }
  registry().push_back(backend);
}

std::string device_backends_report() {
  std::string r;
  for (const auto& b : registry())
    if (b.report) r += b.report();
  return r;
}

const char* device_choice_name(DeviceChoice c) {
  switch (c) {
    case DeviceChoice::kAuto: return "auto";
    case DeviceChoice::kCpu: return "cpu";
    case DeviceChoice::kCuda: return "cuda";
    case DeviceChoice::kCudaSim: return "cuda-sim";
  }
  return "?";
}

DeviceKind resolve_device(DeviceChoice choice) {
  if (choice == DeviceChoice::kCpu) return DeviceKind::cpu;
  if (choice == DeviceChoice::kAuto) {
    const DeviceBackend* gpu = find(DeviceKind::cuda);
    return gpu && gpu->device_count() > 0 ? DeviceKind::cuda : DeviceKind::cpu;
  }
  const DeviceKind kind = choice == DeviceChoice::kCuda ? DeviceKind::cuda : DeviceKind::cuda_sim;
  const std::string name = device_choice_name(choice);
  const DeviceBackend* b = find(kind);
  if (!b)
    fail(strcat("--device ", name, ": this llamatrain was built without the ",
                kind == DeviceKind::cuda ? "CUDA backend (no nvcc at configure time)"
                                         : "CUDA simulator (no CUDA headers at configure time, or the sanitizer build)"));
  if (kind == DeviceKind::cuda && b->device_count() == 0)
    fail("--device cuda: no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them); "
         "use --device cpu or cuda-sim");
  return kind;
}

namespace {

// Seconds of the best of 3 runs of f after one warm-up.
template <class F>
double best_of_3(F&& f) {
  f();
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

DeviceInfo cpu_device_info(int threads, Precision precision) {
  DeviceInfo d;
  std::string model = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  d.name = strcat("CPU: ", model, " (", threads, " threads)");
  d.memory_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  // The GEMM rate through the CPU backend's matmul of this precision: one warm-up, best of 3.
  constexpr int n = 512;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  d.peak_tflops = host_cpu_peak_tflops(threads, &d.peak_what);
  if (precision == Precision::kBf16) {
    std::vector<cpu::bf16> ab(size_t(n) * n, cpu::float_to_bf16(0.5f)), bb(size_t(n) * n, cpu::float_to_bf16(0.25f));
    const double s = best_of_3(
        [&] { cpu::onednn::gemm_bf16(false, true, n, n, n, ab.data(), n, bb.data(), n, false, c.data(), n); });
    d.gemm_tflops = 2.0 * n * n * n / s / 1e12;
    d.gemm_what = strcat("bf16 512^3 oneDNN (", cpu::onednn::gemm_bf16_last_impl(), ")");
    if (cpu::onednn::has_amx()) {
      // AMX-BF16: a 16x16 fp32 tile += 16x32 by 32x16 bf16 (16 * 16 * 32 * 2 FLOPs) every 16 cycles
      // per core, 1024 FLOP/cycle: 16x the AVX-512 fp32 rate (64) that AMX CPUs all have.
      d.peak_tflops *= 1024.0 / 64;
      d.peak_what = strcat("bf16 AMX 1024 FLOP/cycle = 16 x ", d.peak_what);
    }
    return d;
  }
  const double s = best_of_3([&] { cpu::matmul_forward(c.data(), a.data(), b.data(), n, n, n); });
  d.gemm_tflops = 2.0 * n * n * n / s / 1e12;
  d.gemm_what = "fp32 512^3 BLAS";
  return d;
}

double host_cpu_peak_tflops(int threads, std::string* what) {
  std::ifstream info("/proc/cpuinfo");
  std::stringstream text;
  text << info.rdbuf();
  return cpu_peak_tflops(text.str(), threads, what);
}

double cpu_peak_tflops(const std::string& cpuinfo, int threads, std::string* what) {
  double mhz = 0;
  bool avx512 = false, avx2 = false, fma = false;
  std::istringstream in(cpuinfo);
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of(" \t"));
    const std::string value = line.substr(colon + 1);
    if (key == "cpu" && line.rfind("cpu MHz", 0) == 0) mhz = std::max(mhz, std::atof(value.c_str()));
    if (key == "flags") {
      std::istringstream flags(value);
      for (std::string f; flags >> f;) avx512 |= f == "avx512f", avx2 |= f == "avx2", fma |= f == "fma";
    }
  }
  const int per_cycle = avx512 ? 64 : avx2 && fma ? 32 : 16;
  if (what)
    *what = strcat("fp32 ", threads, " threads x ", mhz / 1e3, " GHz x ", per_cycle, " FLOP/cycle (",
                   avx512 ? "AVX-512" : avx2 && fma ? "AVX2 FMA" : "SSE", ")");
  return double(threads) * mhz * 1e6 * per_cycle / 1e12;
}

std::unique_ptr<Engine> make_device_engine(DeviceKind kind, const DeviceEngineSpec& spec, Llama2Model& model,
                                           ZeroOptimizer& zero) {
  const DeviceBackend* b = find(kind);
  LT_CHECK(b && b->make_engine, "no backend registered for device ", device_name(kind));
  return b->make_engine(spec, model, zero);
}

std::unique_ptr<Evaluator> make_evaluator(DeviceKind kind, Llama2Model& model, int local_rank) {
  if (kind == DeviceKind::cpu) return make_cpu_evaluator(model);
  const DeviceBackend* b = find(kind);
  LT_CHECK(b && b->make_evaluator, "no backend registered for device ", device_name(kind));
  return b->make_evaluator(model, local_rank);
}

std::unique_ptr<Decoder> make_decoder(DeviceKind kind, const Llama2Model& model, int max_len, int local_rank) {
  if (kind == DeviceKind::cpu) return std::make_unique<CpuDecoder>(model, max_len);
  const DeviceBackend* b = find(kind);
  LT_CHECK(b && b->make_decoder, "no backend registered for device ", device_name(kind));
  return b->make_decoder(model, max_len, local_rank);
}

std::string cpu_bf16_report() {
  try {
    return strcat("oneDNN ", cpu::onednn::version(), ", ISA ", cpu::onednn::effective_isa());
  } catch (const Error& e) {
    return strcat("unavailable: ", e.what());
  }
}

void set_cpu_precision(Llama2Model& model, Precision p, const char* cmd, bool say) {
  model.set_precision(p);
  if (p != Precision::kBf16 || !say || cpu::onednn::has_amx()) return;
  std::fprintf(stderr,
               "%s: warning: --precision bf16 will be SLOWER than fp32 on this CPU: oneDNN's best ISA here is %s, "
               "without AMX tiles, so its bf16 products run below OpenBLAS's fp32 rate (AMX needs a Sapphire Rapids "
               "or later Xeon and a kernel that grants AMX state); use --precision fp32\n",
               cmd, cpu::onednn::effective_isa().c_str());
}

}  // namespace lt
