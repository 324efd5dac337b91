// Bounded resources: every size read from the command line or a file that drives a large
// allocation (sequence length, vocabulary, model dimensions, batch) is turned into bytes and
// checked against what this machine can still give before anything is allocated, so a huge
// value is refused at once with the bytes it would need instead of swapping or being killed.
#pragma once
#include <cstdint>
#include <string>

namespace lt {

// Bytes this process may still allocate, and where that number came from.
struct MemoryBudget {
  double bytes = 0;
  std::string source;  // "MemAvailable in /proc/meminfo", "cgroup memory.max", "LLAMATRAIN_MEMORY_LIMIT"
};

// The smallest of: MemAvailable (/proc/meminfo; sysconf's available pages where that file is
// missing), the room left under a cgroup v2/v1 memory limit, and LLAMATRAIN_MEMORY_LIMIT (bytes,
// an optional K/M/G/T suffix of powers of 1024) when set. Throws lt::Error for a malformed
// LLAMATRAIN_MEMORY_LIMIT.
MemoryBudget available_memory();

// The share of available_memory() that one allocation plan may use: the rest is left to the
// operating system, the libraries and the page cache.
constexpr double kUsableMemoryFraction = 0.9;

// Throws lt::Error "<what> needs N bytes (X GiB), but this machine has M bytes (Y GiB) available
// (<source>; at most 90% of it is used); <advice>" when `bytes` exceeds the usable share.
// `bytes` is a double so that products of untrusted sizes cannot overflow before the check.
void check_memory_fits(double bytes, const std::string& what, const std::string& advice = "");

// "21474836480 bytes (20.0 GiB)"
std::string bytes_text(double bytes);

// This process's resident memory now (VmRSS) and its high-water mark (VmHWM), from
// /proc/self/status; 0 where that file is missing.
double host_rss_bytes();
double host_peak_rss_bytes();

}  // namespace lt
