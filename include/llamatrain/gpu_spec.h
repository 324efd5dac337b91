// The GPU types llamatrain knows, from the vendors' datasheets: dense bf16 peak, memory bandwidth
// and capacity, found by the names people, Slurm and the CUDA driver use. One table for hostfiles,
// the planner, MFU and the GPU check's benchmarks (tests/gpu/kernel_bench.cu, which compiles this
// file alone: it depends on nothing else of ours but error.h).
#pragma once
#include <string>
#include <vector>

namespace lt {

// Peak figures of a GPU type from the vendor datasheet: dense (no structured sparsity) bf16
// tensor-core TFLOP/s, HBM bandwidth in GB/s (1e9 B/s) and nominal memory capacity.
struct GpuSpec {
  std::string name;
  double bf16_tflops;
  double hbm_gbps;
  double memory_gib;
};

// The spec of a known GPU type, or nullptr: the table's names and their aliases (a100, A100-40GB,
// h100, H100-PCIe, h200, ...) and the names the CUDA driver reports ("NVIDIA H100 80GB HBM3"),
// case-insensitive. The one lookup of GPU names: hostfiles (info, plan), calibration files.
const GpuSpec* find_gpu_spec(const std::string& name);
// find_gpu_spec, or throws lt::Error "<where>: unknown GPU type '<name>'; known types: ...".
const GpuSpec& require_gpu_spec(const std::string& name, const std::string& where);
// For a name that find_gpu_spec takes to mean one of several parts (a100, h100, a100-pcie: no form
// factor or no memory size), what it was read as and how to name the others:
// "gpu=h100 read as H100-SXM5-80GB (989 TFLOP/s dense bf16, 80 GB); for H100-PCIe-80GB or
// H100-NVL-94GB write that name or the one nvidia-smi prints". Empty for an exact name.
std::string gpu_alias_note(const std::string& name);
// The table's names and the common aliases, for messages.
std::string known_gpu_names();

// `s` with ASCII letters in lower case: host names and GPU types compare without case.
std::string ascii_lower(std::string s);
// The spec of the GPU the CUDA runtime names `device_name` (e.g. "NVIDIA H100 80GB HBM3",
// "NVIDIA A100-PCIE-40GB") with `memory_bytes` of memory: find_gpu_spec's, else the family in the
// name with the part told by the memory (A100 40/80 GB); nullptr for a GPU not in the table.
const GpuSpec* gpu_spec_for_device(const std::string& device_name, double memory_bytes);
// Every known type, in table order (for messages and `info`).
const std::vector<GpuSpec>& gpu_specs();

}  // namespace lt
