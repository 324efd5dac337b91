// Is there an NVIDIA GPU on this machine, whatever the CUDA runtime says? Read from the device
// nodes and the kernel module's version file, so that a GPU the runtime cannot use (a driver too old
// for the CUDA runtime this binary was built with) is an error instead of a silent CPU run.
// Host-only code: no CUDA needed to compile or test it.
#pragma once
#include <string>
#include <vector>

namespace lt {

struct GpuPresence {
  std::vector<std::string> device_nodes;  // /dev/nvidia0, /dev/nvidia1, ...
  std::string driver_version;             // "535.104.05" from /proc/driver/nvidia/version ("" if absent)
};

// The NVIDIA device nodes and driver version under `root` ("/" normally; tests pass a fake tree).
// LLAMATRAIN_GPU_PRESENCE_ROOT overrides the default root, for tests of the whole program.
GpuPresence detect_gpu_presence(const std::string& root = "");

// The oldest driver (major version) that runs a CUDA runtime of version `cuda_runtime_version`
// (CUDART_VERSION, e.g. 13000), by CUDA's minor-version compatibility: 13.x 580, 12.x 525, 11.x 450.
int required_driver_major(int cuda_runtime_version);

// The error for a GPU that is present but unusable: what was found, the driver required, and what
// to do. driver_cuda_version is cudaDriverGetVersion's answer (0 when there is no usable driver).
std::string unusable_gpu_message(const GpuPresence& p, int cuda_runtime_version, int driver_cuda_version,
                                 const std::string& runtime_error);


}  // namespace lt
