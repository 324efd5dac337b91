#include "llamatrain/memory.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "llamatrain/error.h"

namespace lt {

namespace {

// The kB figure of `key` in /proc/meminfo, in bytes; < 0 when absent.
double meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kb = -1;
    fields >> kb;
    return kb >= 0 ? kb * 1024 : -1;
  }
  return -1;
}

// A number of bytes from a one-line file ("max" or a missing file: < 0).
double file_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  return *end == '\0' && std::isfinite(v) && v >= 0 ? v : -1;
}

// Room left under the cgroup limit (v2, then v1); < 0 when there is none. A v1 "unlimited"
// limit is a number near 2^63, which the min() below ignores.
double cgroup_room() {
  for (const auto& [limit, usage] :
       {std::pair<const char*, const char*>{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double l = file_number(limit), u = file_number(usage);
    if (l >= 0 && u >= 0) return l > u ? l - u : 0;
  }
  return -1;
}

double parse_memory_limit(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  double scale = 1;
  const std::string suffix = end ? std::string(end) : std::string();
  if (suffix == "K" || suffix == "k") scale = 1024.0;
  else if (suffix == "M") scale = 1024.0 * 1024;
  else if (suffix == "G") scale = 1024.0 * 1024 * 1024;
  else if (suffix == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!suffix.empty()) scale = -1;
  if (end == text.c_str() || scale < 0 || !std::isfinite(v) || v < 0)
    fail(strcat("LLAMATRAIN_MEMORY_LIMIT=", text, ": expected a number of bytes, optionally with K, M, G or T"));
  return v * scale;
}

}  // namespace

MemoryBudget available_memory() {
  MemoryBudget b;
  b.bytes = meminfo_bytes("MemAvailable");
  b.source = "MemAvailable in /proc/meminfo";
  if (b.bytes < 0) {
    b.bytes = double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    b.source = "available pages (sysconf)";
  }
  const double room = cgroup_room();
  if (room >= 0 && room < b.bytes) b = {room, "room under the cgroup memory limit"};
  if (const char* env = std::getenv("LLAMATRAIN_MEMORY_LIMIT")) {
    const double limit = parse_memory_limit(env);
    if (limit < b.bytes) b = {limit, "LLAMATRAIN_MEMORY_LIMIT"};
  }
  return b;
}

std::string bytes_text(double bytes) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.0f bytes (%.1f GiB)", bytes, bytes / (1024.0 * 1024 * 1024));
  return buf;
}

void check_memory_fits(double bytes, const std::string& what, const std::string& advice) {
  const MemoryBudget b = available_memory();
  if (std::isfinite(bytes) && bytes <= kUsableMemoryFraction * b.bytes) return;
  fail(strcat(what, " needs ", bytes_text(bytes), ", but this machine has ", bytes_text(b.bytes), " available (",
              b.source, "; at most ", int(kUsableMemoryFraction * 100), "% of it is used)",
              advice.empty() ? "" : "; ", advice));
}

namespace {

// "VmRSS:    1234 kB" -> bytes.
double proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  const size_t n = std::strlen(key);
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') return std::atof(line.c_str() + n + 1) * 1024.0;
  return 0;
}

}  // namespace

double host_rss_bytes() { return proc_status_kb("VmRSS"); }
double host_peak_rss_bytes() { return proc_status_kb("VmHWM"); }

}  // namespace lt
