// The host half of a device's offloaded optimizer step (train --offload-optimizer,
// src/backend/cuda/device_zero.cu): AdamW over a shard of fp32 master weights and Adam m, v, a
// 4M-element window at a time, each window's updated weights rounded to bf16 for the copy up. What
// plan's host_memory_gbps stands for: the rate is printed as parameters per second and as GB/s at
// adamw_bytes_per_param (30: master, m, v read and written, the gradient read, bf16 written).
// The device copies are not part of it (no GPU here).
//
//   offload_adamw_rate [--params N] [--rounds R]      (threads: OMP_NUM_THREADS; 1 and all are run)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llamatrain/ops_cpu.h"

namespace {

constexpr size_t kWindow = size_t(1) << 22;  // DeviceZero::kHostWindow

// One offloaded step over the shard; returns seconds.
double one_step(std::vector<float>& p, std::vector<float>& m, std::vector<float>& v, const std::vector<float>& g,
                std::vector<uint16_t>& out, int t) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t lo = 0; lo < p.size(); lo += kWindow) {
    const size_t n = std::min(kWindow, p.size() - lo);
    lt::cpu::adamw_update(p.data() + lo, m.data() + lo, v.data() + lo, g.data() + lo, n, 1e-4f, 0.9f, 0.95f, 1e-8f,
                          0.1f, t);
    lt::cpu::round_to_bf16(out.data(), p.data() + lo, n);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t(1) << 26;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--params" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: offload_adamw_rate [--params N] [--rounds R]\n");
      return 2;
    }
  }
  if (n == 0 || rounds <= 0) {
    std::fprintf(stderr, "offload_adamw_rate: --params and --rounds must be > 0\n");
    return 2;
  }
  std::vector<float> p(n), m(n, 0.f), v(n, 0.f), g(n);
  std::vector<uint16_t> out(kWindow);
  for (size_t i = 0; i < n; ++i) {
    p[i] = 0.02f * float(int(i % 2001) - 1000) / 1000.f;
    g[i] = 1e-3f * float(int(i % 997) - 498) / 498.f;
  }
  const int all = omp_get_max_threads();
  std::printf("offload_adamw_rate: %zu parameters (%.2f GB of master, m, v), windows of %zu, best of %d\n", n,
              12.0 * double(n) / 1e9, kWindow, rounds);
  std::printf("%8s %14s %14s %22s\n", "threads", "Mparams/s", "GB/s at 30 B", "s per 70B/8 shard");
  std::vector<int> counts{1};
  if (all > 1) counts.push_back(all);
  int t = 1;
  for (int threads : counts) {
    omp_set_num_threads(threads);
    double best = 1e30;
    for (int r = 0; r < rounds; ++r) best = std::min(best, one_step(p, m, v, g, out, t++));
    const double rate = double(n) / best;
    std::printf("%8d %14.1f %14.2f %22.1f\n", threads, rate / 1e6, 30.0 * rate / 1e9, 68976648192.0 / 8 / rate);
  }
  // Keep the result observable.
  uint64_t sum = 0;
  for (uint16_t x : out) sum += x;
  std::printf("(checksum %llu)\n", (unsigned long long)sum);
  return 0;
}
