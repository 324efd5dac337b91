// Hostfiles: the Open MPI hostfile a job is launched with, read back as an inventory of nodes
// for `info --hostfile` and the planner. The file stays valid for `mpirun --hostfile`; what
// Open MPI cannot express (the GPUs and the network of a node) rides in a trailing comment:
//
//   # The reference cluster (comment lines and blank lines are ignored)
//   xe9680 slots=8 max_slots=8   # gpu=A100-SXM4-80GB nic_gbps=100
//   r760xa slots=4               # gpu=H100-PCIe-80GB gpus=4 nic_gbps=100 spare node
//
// gpu= takes the names find_gpu_spec knows (an unknown type is an error at its line) and is
// stored as the table's name (gpu=a100 reads as A100-SXM4-80GB).
// A host line is `HOST [slots=N] [max_slots=M]` (we accept only these two keys, not Open MPI's
// aliases count=, cpu=, max-slots=, ..., so every hostfile reads the same). In the trailing
// comment, words of the form key=value are the annotation (gpu=<type>, gpus=<count>, default
// the slots: one rank per GPU; nic_gbps=<Gb/s>); other words are free text. At run time the
// detected devices win over the annotation (DESIGN.md, "Distributed training").
#pragma once
#include <string>
#include <vector>

namespace lt {

struct HostEntry {
  std::string host;
  int slots = 1;         // ranks placed on the node; 1 if not given (Open MPI then counts cores: give it)
  int max_slots = 0;     // 0: not given (the hostfile sets no cap)
  std::string gpu;       // annotation gpu=<type> as GpuSpec::name; empty: no GPUs described
  int gpus = 0;          // annotation gpus=<count>; defaults to slots when gpu= is given
  double nic_gbps = 0;   // annotation nic_gbps=<n>; 0: not given
  int line = 0;          // 1-based line in the hostfile
};

struct Hostfile {
  std::string path;      // the origin the entries were read from (for messages)
  std::vector<HostEntry> hosts;
  int total_slots() const;
};

// Parses hostfile text. Errors throw lt::Error "<origin>:<line>: <what>: expected <...>".
// `origin` names the text in messages (a path, or e.g. "<test>").
Hostfile parse_hostfile_text(const std::string& text, const std::string& origin);
// Reads and parses the file at `path`; a missing file is "<path>: cannot open (...)".
Hostfile read_hostfile(const std::string& path);

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
