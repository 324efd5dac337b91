// Helpers of the device check program (tests/gpu): error checks that name the failing statement,
// device buffers, padded bf16 head tensors, the PASS/FAIL bookkeeping, and the kernel timer.
// The padded matrix, the worst-element report and the sentinel come from tests/sim/sim_test_util.h,
// shared with the simulator tests, so both runs of a kernel are judged by the same helpers.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim_test_util.h"

namespace lt::gpucheck {

using simtest::bf;
using simtest::Bf16Matrix;
using simtest::describe;
using simtest::ErrorReport;
using simtest::kPad;
using simtest::kSentinel;

// ---- error checks: one generator for every API ------------------------------------------------
inline bool api_ok(cudaError_t e) { return e == cudaSuccess; }
inline bool api_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline const char* api_string(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* api_string(cublasStatus_t s) { return cublasGetStatusString(s); }

[[noreturn]] inline void api_failure(const char* api, int code, const char* what, const char* stmt, const char* file,
                                     int line) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, "%s error %d (%s) in `%s` at %s:%d", api, code, what, stmt, file, line);
  throw std::runtime_error(buf);
}

}  // namespace lt::gpucheck

// LT_GPUCHECK_API(api, stmt): evaluates stmt once; on a non-success status throws std::runtime_error
// "<api> error <code> (<message>) in `<stmt>` at file:line". One process, so no rank to name. The
// LT_GPUCHECK_ prefix keeps these apart from the backend's own check macros (this program links
// only the kernels and the CPU ops, never src/backend/cuda).
#define LT_GPUCHECK_API(api, stmt)                                                                  \
  do {                                                                                             \
    const auto lt_status_ = (stmt);                                                                \
    if (!::lt::gpucheck::api_ok(lt_status_))                                                       \
      ::lt::gpucheck::api_failure(api, static_cast<int>(lt_status_),                               \
                                  ::lt::gpucheck::api_string(lt_status_), #stmt, __FILE__, __LINE__); \
  } while (0)
#define LT_GPUCHECK_CUDA(stmt) LT_GPUCHECK_API("CUDA", stmt)
#define LT_GPUCHECK_CUBLAS(stmt) LT_GPUCHECK_API("cuBLAS", stmt)
// After a launch: the launch itself is checked by lt::launch_kernel; this catches faults while it ran.
#define LT_GPUCHECK_SYNC() LT_GPUCHECK_CUDA(cudaDeviceSynchronize())

namespace lt::gpucheck {

// ---- device memory ------------------------------------------------------------------------------
// A cudaMalloc'ed array of n T; copies whole host vectors (padding and sentinels included) both ways.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) LT_GPUCHECK_CUDA(cudaMalloc(&ptr_, n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_), std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);  // never throws; a sticky error shows at the next checked call
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::logic_error("DeviceBuffer::upload: size mismatch");
    if (n_ > 0) LT_GPUCHECK_CUDA(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(std::vector<T>& host) const {
    host.resize(n_);
    if (n_ > 0) LT_GPUCHECK_CUDA(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> host() const {
    std::vector<T> h;
    download(h);
    return h;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// ---- host inputs ----------------------------------------------------------------------------------
using simtest::random_bf16;

// A padded (rows, NH, hd) bf16 tensor (rope and attention): head stride hd + head_pad, token stride
// NH * head stride + kPad, padding holding the sentinel. head_pad a multiple of 8 keeps heads
// 16-byte aligned, as the attention kernels require.
struct Bf16Heads {
  int rows, NH, hd;
  int64_t head_stride, token_stride;
  std::vector<__nv_bfloat16> data;
  Bf16Heads(int r, int nh, int d, int head_pad)
      : rows(r), NH(nh), hd(d), head_stride(d + head_pad), token_stride(nh * (d + head_pad) + kPad),
        data(static_cast<size_t>(r) * (nh * (d + head_pad) + kPad) + kPad, __float2bfloat16(kSentinel)) {}
  size_t index(int r, int h, int c) const { return static_cast<size_t>(r) * token_stride + h * head_stride + c; }
  float get(int r, int h, int c) const { return __bfloat162float(data[index(r, h, c)]); }
  void set(int r, int h, int c, float v) { data[index(r, h, c)] = __float2bfloat16(v); }
  void fill_normal(std::mt19937& rng, float std) {
    std::normal_distribution<float> dist(0.f, std);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < hd; ++c) set(r, h, c, dist(rng));
  }
  int touched_padding() const {
    std::vector<char> inside(data.size(), 0);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < hd; ++c) inside[index(r, h, c)] = 1;
    int bad = 0;
    for (size_t i = 0; i < data.size(); ++i)
      if (!inside[i] && __bfloat162float(data[i]) != kSentinel) ++bad;
    return bad;
  }
  // Dense (rows, NH, hd) copy for the CPU ops.
  template <class T>
  std::vector<T> dense() const {
    std::vector<T> v(static_cast<size_t>(rows) * NH * hd);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < NH; ++h)
        for (int c = 0; c < hd; ++c) v[(static_cast<size_t>(r) * NH + h) * hd + c] = get(r, h, c);
    return v;
  }
};

// ---- PASS/FAIL bookkeeping --------------------------------------------------------------------------
// One entry per kernel; expect() prints "FAIL ..." with the message and marks the current kernel.
// A CUDA error that poisons the context (an illegal address, a kernel fault): nothing after it can
// run in this process. main() exits with kExitSticky naming the family it happened in, and
// scripts/gpu-check.sh starts the program again after that family (--after), so one fault costs
// one family, not the table.
struct StickyError : std::runtime_error {
  StickyError(const std::string& fam, const std::string& what) : std::runtime_error(what), family(fam) {}
  std::string family;
};

class Checks {
 public:
  // Called with each check's name as it begins: the simulator build's rehearsal of a sticky error
  // (tests/gpu/sim/checks_on_sim.cpp) poisons its runtime there; null in the device program.
  static inline void (*begin_hook)(const std::string& kernel) = nullptr;

  // Each result is also appended to `path` the moment it is known, one line
  // "PASS|FAIL|SKIP<TAB>kernel<TAB>detail": a run that dies later keeps every result before it.
  void write_results_to(const std::string& path) { results_path_ = path; }
  void begin(const std::string& kernel) {
    current_ = kernel, current_ok_ = true, current_fail_.clear();
    std::printf("== %s\n", kernel.c_str());
    if (begin_hook) begin_hook(kernel);
  }
  bool expect(bool cond, const std::string& what) {
    if (!cond) {
      current_ok_ = false;
      if (current_fail_.empty()) current_fail_ = what;
      std::printf("  FAIL %s: %s\n", current_.c_str(), what.c_str());
    }
    return cond;
  }
  void end() {
    results_.emplace_back(current_, current_ok_);
    std::printf("%s %s\n", current_ok_ ? "PASS" : "FAIL", current_.c_str());
    std::fflush(stdout);
    append_result(current_ok_ ? "PASS" : "FAIL", current_, current_fail_);
  }
  // A kernel whose check threw (a CUDA error, a rejected argument): recorded as failed.
  void abort_current(const std::string& why) {
    expect(false, "exception: " + why);
    end();
  }
  // A check that cannot run here (cuDNN absent, or the simulator build): listed, neither passed nor failed.
  void skip(const std::string& kernel, const std::string& why) {
    skipped_.emplace_back(kernel, why);
    std::printf("== %s\nSKIP %s: %s\n", kernel.c_str(), kernel.c_str(), why.c_str());
    std::fflush(stdout);
    append_result("SKIP", kernel, why);
  }
  // Ends a check of someone else's code (cuDNN, the yardstick): a failure or an exception is a SKIP
  // with its reason, not a FAIL of ours.
  void end_as_yardstick(const std::string& exception_what = "") {
    if (exception_what.empty() && current_ok_) return end();
    const std::string why = exception_what.empty() ? "its result differs from the reference: " + current_fail_
                                                   : "it failed: " + exception_what;
    skipped_.emplace_back(current_, why);
    std::printf("SKIP %s: %s\n", current_.c_str(), why.c_str());
    std::fflush(stdout);
    append_result("SKIP", current_, why);
  }
  const std::vector<std::pair<std::string, std::string>>& skipped() const { return skipped_; }
  int failures() const {
    int n = 0;
    for (const auto& r : results_) n += !r.second;
    return n;
  }
  const std::vector<std::pair<std::string, bool>>& results() const { return results_; }

 private:
  void append_result(const char* verdict, const std::string& kernel, const std::string& detail) const {
    if (results_path_.empty()) return;
    FILE* f = std::fopen(results_path_.c_str(), "a");
    if (!f) {
      std::printf("warning: cannot append to %s\n", results_path_.c_str());
      return;
    }
    std::string d = detail;
    for (char& c : d)
      if (c == '\t' || c == '\n') c = ' ';
    std::fprintf(f, "%s\t%s\t%s\n", verdict, kernel.c_str(), d.c_str());
    std::fclose(f);
  }
  std::string current_, current_fail_, results_path_;
  bool current_ok_ = true;
  std::vector<std::pair<std::string, bool>> results_;
  std::vector<std::pair<std::string, std::string>> skipped_;
};

// The low-precision rule (STYLE.md): the kernel's worst error against fp64 is at most 2x that of the
// naive bf16 computation (the fp32 CPU result rounded to bf16); every value finite.
inline void expect_rule(Checks& ck, const std::string& what, const ErrorReport& kernel, const ErrorReport& naive) {
  std::printf("  %s\n  %s\n  %s kernel/naive ratio %.3f\n", describe((what + " kernel vs fp64").c_str(), kernel).c_str(),
              describe((what + " naive bf16 vs fp64").c_str(), naive).c_str(), what.c_str(),
              naive.worst > 0 ? kernel.worst / naive.worst : 0.0);
  ck.expect(kernel.finite, what + ": NaN/Inf in the kernel's output");
  ck.expect(kernel.worst <= 2.0 * naive.worst, describe((what + " beyond 2x naive bf16").c_str(), kernel));
}

// A bf16 matrix result against the dense fp32 and fp64 references.
inline void compare_rule(Checks& ck, const std::string& what, const Bf16Matrix& got, const std::vector<float>& r32,
                         const std::vector<double>& r64) {
  ErrorReport kernel, naive;
  for (int i = 0; i < got.N; ++i)
    for (int c = 0; c < got.C; ++c) {
      const size_t k = static_cast<size_t>(i) * got.C + c;
      kernel.add(i, c, got.get(i, c), r64[k]);
      naive.add(i, c, bf(r32[k]), r64[k]);
    }
  expect_rule(ck, what, kernel, naive);
  ck.expect(got.touched_padding() == 0, what + ": padding written");
}

// A (rows, NH, hd) result against dense references; column = h * hd + c.
inline void compare_rule(Checks& ck, const std::string& what, const Bf16Heads& got, const std::vector<float>& r32,
                         const std::vector<double>& r64) {
  ErrorReport kernel, naive;
  for (int r = 0; r < got.rows; ++r)
    for (int h = 0; h < got.NH; ++h)
      for (int c = 0; c < got.hd; ++c) {
        const size_t k = (static_cast<size_t>(r) * got.NH + h) * got.hd + c;
        kernel.add(r, h * got.hd + c, got.get(r, h, c), r64[k]);
        naive.add(r, h * got.hd + c, bf(r32[k]), r64[k]);
      }
  expect_rule(ck, what, kernel, naive);
  ck.expect(got.touched_padding() == 0, what + ": padding written");
}

inline std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// ---- timing -------------------------------------------------------------------------------------------
// Median of `reps` timings (cudaEvents around each call on the default stream) after `warmup` calls.
template <class F>
double median_ms(F&& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  LT_GPUCHECK_SYNC();
  cudaEvent_t start, stop;
  LT_GPUCHECK_CUDA(cudaEventCreate(&start));
  LT_GPUCHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    LT_GPUCHECK_CUDA(cudaEventRecord(start, nullptr));
    fn();
    LT_GPUCHECK_CUDA(cudaEventRecord(stop, nullptr));
    LT_GPUCHECK_CUDA(cudaEventSynchronize(stop));
    LT_GPUCHECK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], start, stop));
  }
  LT_GPUCHECK_CUDA(cudaEventDestroy(start));
  LT_GPUCHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
}

// Where a run that starts after the family `after` begins: the index after it in `names` (0 for
// none); std::invalid_argument naming `option` when no family has that name.
inline size_t index_after(const std::vector<std::string>& names, const std::string& after, const char* option) {
  if (after.empty()) return 0;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == after) return i + 1;
  throw std::invalid_argument(std::string(option) + " " + after + ": no such family");
}

// The two entry points main() calls (kernel_checks.cu, kernel_bench.cu). Each runs its families in
// order, our kernels first and cuDNN's last, starting after the family named `after` (empty: from
// the first; an unknown name throws std::invalid_argument), and throws StickyError when a family
// poisons the context.
void run_kernel_checks(Checks& ck, const std::string& after = "");
std::vector<std::string> kernel_check_names();
struct BenchOptions {
  int warmup = 3, reps = 20;
  const char* table_path = nullptr;  // also append the table there as Markdown, row by row
  std::string after;                 // start after this benchmark family
};
// Returns the number of benchmark families that stopped on a (not sticky) error.
int run_kernel_benchmarks(const BenchOptions& opt);
std::vector<std::string> kernel_bench_names();

}  // namespace lt::gpucheck
