// llamatrain_gpu_check: the kernel tests and benchmarks on a real GPU (DESIGN.md, "Testing without a
// GPU", point 3), run by scripts/gpu-check.sh. Plain main(), no test framework, so the binary and the
// few shared libraries it needs can be carried to a GPU machine that has none of our packages.
//   1. device report: name, compute capability, SMs, clocks, memory;
//   2. correctness of every kernel family against the CPU backend (kernel_checks.cu), PASS/FAIL each,
//      and of cuDNN's fused attention (--attention cudnn; SKIP with the reason when cuDNN is absent);
//   3. benchmarks on Llama-2-7b shapes with the table (kernel_bench.cu), cuDNN's attention next to ours.
// Every check result goes to --results FILE and every benchmark row to --table FILE.md the moment it
// is known. A sticky CUDA error ends the program with status 4 and the line
// "llamatrain_gpu_check: STICKY checks|bench FAMILY: ..."; scripts/gpu-check.sh then starts it again
// with --after FAMILY (checks) or --bench-only --bench-after FAMILY, appending to the same files.
// Exit status: 0 every check passed; 1 a check failed; 2 no CUDA device (nothing was run);
// 3 a CUDA/cuBLAS error or another exception stopped the program; 4 a sticky CUDA error (above);
// 64 bad usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "gpu_check_util.cuh"

namespace {

constexpr int kExitFailed = 1, kExitNoDevice = 2, kExitError = 3, kExitSticky = 4, kExitUsage = 64;

void usage(FILE* f) {
  std::fprintf(f,
               "usage: llamatrain_gpu_check [--checks-only | --bench-only] [--reps N] [--table FILE.md]\n"
               "                            [--results FILE] [--after CHECK] [--bench-after FAMILY] [--device I] [--list]\n"
               "  Kernel correctness on the device against the CPU backend, then benchmarks on Llama-2-7b shapes.\n"
               "  Results are appended to FILE (checks) and FILE.md (benchmark rows) as they are measured.\n"
               "  Exit status: 0 pass, 1 a check failed, 2 no CUDA device, 3 CUDA error, 4 sticky CUDA error\n"
               "  (rerun after the family it names), 64 usage.\n");
}

void print_device(int dev) {
  cudaDeviceProp prop;
  LT_GPUCHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  int sm_khz = 0, mem_khz = 0, bus_bits = 0, driver = 0, runtime = 0;
  LT_GPUCHECK_CUDA(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev));
  LT_GPUCHECK_CUDA(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev));
  LT_GPUCHECK_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
  LT_GPUCHECK_CUDA(cudaDriverGetVersion(&driver));
  LT_GPUCHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  // DDR: two transfers per memory clock.
  const double peak_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  std::printf("device %d: %s, compute capability %d.%d, %d SMs, SM clock (max) %.0f MHz, memory clock %.0f MHz, "
              "bus %d bits (theoretical %.0f GB/s), %.1f GiB, L2 %.1f MiB\n",
              dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount, sm_khz / 1e3, mem_khz / 1e3, bus_bits,
              peak_gbs, prop.totalGlobalMem / 1073741824.0, prop.l2CacheSize / 1048576.0);
  std::printf("driver %d.%d, runtime %d.%d; binary built for sm_80 and sm_90 (SASS) + compute_90 (PTX)\n",
              driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  if (prop.major < 8) std::printf("warning: compute capability < 8.0: the bf16 kernels are not built for it\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool checks = true, bench = true;
  int device = 0;
  std::string results, after;
  lt::gpucheck::BenchOptions opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--checks-only") {
      bench = false;
    } else if (a == "--bench-only") {
      checks = false;
    } else if (a == "--reps" && has_value) {
      opt.reps = std::atoi(argv[++i]);
      if (opt.reps < 1) return usage(stderr), kExitUsage;
    } else if (a == "--table" && has_value) {
      opt.table_path = argv[++i];
    } else if (a == "--results" && has_value) {
      results = argv[++i];
    } else if (a == "--after" && has_value) {
      after = argv[++i];
    } else if (a == "--bench-after" && has_value) {
      opt.after = argv[++i];
    } else if (a == "--list") {
      for (const auto& n : lt::gpucheck::kernel_check_names()) std::printf("check %s\n", n.c_str());
      for (const auto& n : lt::gpucheck::kernel_bench_names()) std::printf("bench %s\n", n.c_str());
      return 0;
    } else if (a == "--device" && has_value) {
      device = std::atoi(argv[++i]);
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "llamatrain_gpu_check: unknown or incomplete argument '%s'\n", a.c_str());
      usage(stderr);
      return kExitUsage;
    }
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);

  // No device (no driver, no GPU, CUDA_VISIBLE_DEVICES empty): say so and run nothing.
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("llamatrain_gpu_check: no CUDA device (cudaGetDeviceCount: %s); nothing was checked\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return kExitNoDevice;
  }
  if (device < 0 || device >= count) {
    std::fprintf(stderr, "llamatrain_gpu_check: --device %d but %d device(s)\n", device, count);
    return kExitUsage;
  }

  lt::gpucheck::Checks ck;
  if (!results.empty()) ck.write_results_to(results);
  const char* part = "checks";
  try {
    LT_GPUCHECK_CUDA(cudaSetDevice(device));
    print_device(device);
    if (checks) {
      lt::gpucheck::run_kernel_checks(ck, after);
      std::printf("\n== correctness summary\n");
      for (const auto& r : ck.results()) std::printf("%s %s\n", r.second ? "PASS" : "FAIL", r.first.c_str());
      for (const auto& r : ck.skipped()) std::printf("SKIP %s: %s\n", r.first.c_str(), r.second.c_str());
      std::printf("%zu kernels, %d failed\n", ck.results().size(), ck.failures());
    }
    part = "bench";
    if (bench && lt::gpucheck::run_kernel_benchmarks(opt) > 0) return kExitError;
  } catch (const lt::gpucheck::StickyError& e) {
    std::printf("llamatrain_gpu_check: STICKY %s %s: %s\n", part, e.family.c_str(), e.what());
    return kExitSticky;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "llamatrain_gpu_check: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::printf("llamatrain_gpu_check: ERROR: %s\n", e.what());
    return kExitError;
  }
  return ck.failures() > 0 ? kExitFailed : 0;
}
