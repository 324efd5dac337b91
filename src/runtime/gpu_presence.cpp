// GPU presence from the device nodes and the kernel module (see gpu_presence.h).
#include "llamatrain/gpu_presence.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "llamatrain/error.h"

namespace lt {
namespace {

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..." -> "535.104.05"
// (the open kernel modules write "Open Kernel Module for x86_64  580.65.06 ...").
std::string driver_version_from(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  if (!std::getline(in, line)) return "";
  static const std::regex version(R"(Kernel Module.*?\s([0-9]+\.[0-9]+(?:\.[0-9]+)?)(?:\s|$))");
  std::smatch m;
  return std::regex_search(line, m, version) ? m[1].str() : "";
}

std::string cuda_version_text(int v) { return strcat(v / 1000, ".", v % 1000 / 10); }

}  // namespace

GpuPresence detect_gpu_presence(const std::string& root) {
  std::string base = root;
  if (base.empty()) {
    const char* env = std::getenv("LLAMATRAIN_GPU_PRESENCE_ROOT");
    base = env && *env ? env : "/";
  }
  if (base.back() != '/') base += '/';
  GpuPresence p;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base + "dev", ec)) {
    const std::string name = e.path().filename().string();  // nvidia0, nvidia1, ... (not nvidiactl)
    if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos)
      p.device_nodes.push_back(e.path().string());
  }
  std::sort(p.device_nodes.begin(), p.device_nodes.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;  // nvidia2 before nvidia10
  });
  p.driver_version = driver_version_from(base + "proc/driver/nvidia/version");
  return p;
}

int required_driver_major(int cuda_runtime_version) {
  if (cuda_runtime_version >= 13000) return 580;
  if (cuda_runtime_version >= 12000) return 525;
  return 450;
}

std::string unusable_gpu_message(const GpuPresence& p, int cuda_runtime_version, int driver_cuda_version,
                                 const std::string& runtime_error) {
  std::string nodes;
  for (const std::string& n : p.device_nodes) nodes += (nodes.empty() ? "" : ", ") + n;
  const std::string driver = p.driver_version.empty() ? "an unknown driver version (no /proc/driver/nvidia/version)"
                                                      : "driver " + p.driver_version;
  std::string msg = strcat(p.device_nodes.size(), " NVIDIA GPU device node(s) (", nodes, ") and ", driver,
                           " were found, but the CUDA runtime cannot use them: ", runtime_error, ". This llamatrain ",
                           "was built with the CUDA ", cuda_version_text(cuda_runtime_version), " runtime, which needs ",
                           "driver ", required_driver_major(cuda_runtime_version), " or newer");
  if (driver_cuda_version > 0)
    msg += strcat(" (the installed driver supports CUDA ", cuda_version_text(driver_cuda_version), " at most)");
  return msg + ". Install a newer driver (or build llamatrain with a CUDA toolkit the driver supports), or train on "
               "the CPU on purpose with --device cpu";
}

}  // namespace lt
