// What this CPU's AMX tiles deliver, the ceiling of every bf16 product on it (issue 19): bf16
// multiply-accumulates per second of TDPBF16PS, measured three ways, each on every thread at once:
//   compute  4 accumulator tiles, the operand tiles loaded once: the tile unit alone
//   L1       the 2x2 inner loop of a GEMM (2 A and 2 B tiles loaded per 4 products, the most
//            reuse 8 tiles allow) over operands that stay in L1 (4 KiB)
//   L2       the same loop streaming 2 x 256 KiB of operands (L2-resident, as a GEMM's blocks)
// Each is checked first: after 1000 products of tiles of ones, an accumulator must hold exactly
// 32000 (every partial sum is exact in fp32). GFLOP/s = 2 x 16 x 16 x 32 per product x products / s.
//
// Usage: amx_tile_rate [--threads N (OMP_NUM_THREADS)] [--seconds S per measurement, 1]
// Exit: 0 measured; 2 the CPU or the kernel grants no AMX (nothing to measure here).
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSTATE component
constexpr long kXfeatureXtiledata = 18;     // the AMX tile data component

// CPUID leaf 7: AMX-BF16 is EDX bit 22, AMX-TILE bit 24.
bool cpu_has_amx() {
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  return (d >> 22 & 1) && (d >> 24 & 1);
}

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-7 as 16 rows of 64 bytes: fp32 16x16 accumulators, bf16 16x32 operands (B in pairs).
AMX_TARGET void configure() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int i = 0; i < 8; ++i) c.colsb[i] = 64, c.rows[i] = 16;
  // ldtilecfg's operand is hidden inside the intrinsic's asm: without this barrier GCC -O2 drops the
  // stores above as dead and the instruction faults on a garbage configuration.
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `rounds` rounds of 4 products; returns products per second and, in *sum, accumulator
// tile 0's element (0, 0).
enum class Kind { compute, l1, l2 };

AMX_TARGET double run(Kind kind, const uint16_t* ops, size_t op_tiles, long rounds, float* sum) {
  alignas(64) float out[16 * 16];
  // (The tile intrinsics are statements: one per line.)
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ops, 64);
  _tile_loadd(5, ops + 512, 64);
  _tile_loadd(6, ops + 1024, 64);
  _tile_loadd(7, ops + 1536, 64);
  const auto t0 = std::chrono::steady_clock::now();
  if (kind == Kind::compute) {
    for (long r = 0; r < rounds; ++r) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  } else {
    const size_t groups = op_tiles / 4;  // 4 tiles (2 A, 2 B) per round, cycling over the buffer
    size_t at = 0;
    for (long r = 0; r < rounds; ++r) {
      const uint16_t* g = ops + at * 4 * 512;
      at = at + 1 == groups ? 0 : at + 1;
      _tile_loadd(4, g, 64);
      _tile_loadd(6, g + 1024, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, g + 1536, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, g + 512, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 64);
  const double s = seconds_since(t0);
  *sum = out[0];
  return 4.0 * double(rounds) / s;
}

AMX_TARGET void release() { _tile_release(); }

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else return std::fprintf(stderr, "amx_tile_rate: unknown option %s\n", argv[i]), 1;
  }
  if (!cpu_has_amx()) return std::printf("amx_tile_rate: this CPU has no AMX-BF16 tiles\n"), 2;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return std::printf("amx_tile_rate: the kernel refused AMX tile state (arch_prctl)\n"), 2;
  // Operands: bf16 1.0 in every tile (0x3f80), so each product adds 32 to every accumulator element.
  const size_t l1_tiles = 4, l2_tiles = 512;  // 4 KiB and 512 KiB (2 x 256 KiB)
  std::printf("amx_tile_rate: %d threads, %.1f s per measurement; GFLOP/s per thread and in all\n", threads, seconds);
  const Kind kinds[] = {Kind::compute, Kind::l1, Kind::l2};
  const char* names[] = {"compute (no loads)", "2x2 loop, operands in L1", "2x2 loop, operands in L2"};
  int bad = 0;
  for (int k = 0; k < 3; ++k) {
    std::vector<double> rate(size_t(threads), 0.0);
    std::vector<int> wrong(size_t(threads), 0);
#pragma omp parallel num_threads(threads)
    {
      const size_t tiles = kinds[k] == Kind::l2 ? l2_tiles : l1_tiles;
      std::vector<uint16_t> ops(tiles * 512 + 32, 0x3f80);
      configure();
      float sum = 0;
      run(kinds[k], ops.data(), tiles, 1000, &sum);  // the check: 1000 products of 32 ones each
      if (sum != 32000.0f) wrong[size_t(omp_get_thread_num())] = 1;
      long rounds = 1 << 16;  // calibrate to about `seconds`
      double r = run(kinds[k], ops.data(), tiles, rounds, &sum);
      rounds = long(r / 4.0 * seconds);
      r = run(kinds[k], ops.data(), tiles, rounds, &sum);
      rate[size_t(omp_get_thread_num())] = r;
      release();
    }
    double all = 0;
    for (int t = 0; t < threads; ++t) all += rate[size_t(t)], bad += wrong[size_t(t)];
    const double flop = 2.0 * 16 * 16 * 32;
    std::printf("  %-28s %8.0f per thread %8.0f in all\n", names[k], all / threads * flop / 1e9, all * flop / 1e9);
  }
  if (bad) return std::printf("amx_tile_rate: an accumulator did not hold the exact sum\n"), 1;
  return 0;
}
