// Hostfiles: the Open MPI hostfile a job is launched with, read back as an inventory of nodes
// for `info --hostfile` and the planner. The file stays valid for `mpirun --hostfile`; what
// Open MPI cannot express (the GPUs and the network of a node) rides in a trailing comment:
//
//   # The reference cluster (comment lines and blank lines are ignored)
//   xe9680 slots=8 max_slots=8   # gpu=A100-SXM4-80GB nic_gbps=100
//   r760xa slots=4               # gpu=NVIDIA H100 PCIe gpus=4 nic_gbps=100 # spare node
//
// gpu= takes the names find_gpu_spec knows (an unknown type is an error at its line) and is
// stored as the table's name (gpu=a100 reads as A100-SXM4-80GB, and gpu_note says so). A name may
// have spaces (the names nvidia-smi prints), in quotes or not: gpu= takes the words up to the next
// key=value.
// A host line is `HOST [slots=N] [max_slots=M]` (we accept only these two keys, not Open MPI's
// aliases count=, cpu=, max-slots=, ..., so every hostfile reads the same). In the trailing
// comment, up to a second '#', is the annotation (gpu=<type>, gpus=<count>, default the slots: one
// rank per GPU; nic_gbps=<Gb/s>; on a CPU node threads=<count>, the OpenMP threads per rank the job
// will run there, for the planner); a word it does not know is an error at its line and column, and
// text after the second '#' (or a comment with no '=' at all) is free. At run time the
// detected devices win over the annotation (DESIGN.md, "Distributed training").
#pragma once
#include <string>
#include <vector>

#include "llamatrain/gpu_spec.h"  // the GPU types gpu= names

namespace lt {

struct HostEntry {
  std::string host;
  int slots = 1;         // ranks placed on the node; 1 if not given (Open MPI then counts cores: give it)
  int max_slots = 0;     // 0: not given (the hostfile sets no cap)
  std::string gpu;       // annotation gpu=<type> as GpuSpec::name; empty: no GPUs described
  std::string gpu_note;  // gpu_alias_note of the name written: which part an alias was read as
  int gpus = 0;          // annotation gpus=<count>; defaults to slots when gpu= is given
  double nic_gbps = 0;   // annotation nic_gbps=<n>; 0: not given
  int threads = 0;       // annotation threads=<n> (CPU nodes): OpenMP threads per rank; 0: not given
  int line = 0;          // 1-based line in the hostfile
};

struct Hostfile {
  std::string path;      // the origin the entries were read from (for messages)
  std::vector<HostEntry> hosts;
  int total_slots() const;
  // "<path>:<line>: <gpu_note>" for each host whose gpu= was an alias of several parts.
  std::vector<std::string> gpu_notes() const;
};

// Parses hostfile text. Errors throw lt::Error "<origin>:<line>: <what>: expected <...>".
// `origin` names the text in messages (a path, or e.g. "<test>").
Hostfile parse_hostfile_text(const std::string& text, const std::string& origin);
// Reads and parses the file at `path`; a missing file is "<path>: cannot open (...)".
Hostfile read_hostfile(const std::string& path);


}  // namespace lt
