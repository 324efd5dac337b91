// Where the model's forward and backward run: the CPU backend (the reference), the CUDA backend
// on a GPU, or the CUDA backend with its kernels in the simulator (cuda-sim, for CI and laptops).
// The CUDA builds register themselves from main() (src/cli/main.cpp calls their
// llamatrain_register_<flavour>_backend()), so the core library does not depend on them; a backend
// that was not built into the executable is refused with a message saying so.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "llamatrain/comm_wait.h"
#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/model.h"
#include "llamatrain/zero.h"

namespace lt {

enum class DeviceKind { cpu, cuda, cuda_sim };

// How the optimizer on a device runs its collectives (train --comm-timeout, --bucket-mb; the
// defaults are in comm_wait.h), and where its state lives (--offload-optimizer).
struct DeviceCollectives {
  // How long a collective on device buffers may take before the rank aborts it and ends the job
  // (llamatrain/comm_wait.h).
  double timeout_s = kDefaultCommTimeoutS;
  // Gradient buckets (src/backend/cuda/device_zero.h): consecutive parameter blocks are reduced
  // together until a bucket holds at least this many bytes of fp32 gradients; 0: one per block.
  size_t bucket_bytes = kDefaultBucketMiB << 20;
  // ZeRO 3: blocks whose gather is issued ahead of their use (--zero3-prefetch, 0 or 1; each holds
  // one more block's bf16 weights).
  int zero3_prefetch = 1;
  // --offload-optimizer (ZeRO 1-3): the fp32 master weights and Adam m, v stay in host memory (the
  // host's shard, which checkpoints read) and the update runs there; the device keeps only the
  // bf16 working weights and the gradients (src/backend/cuda/device_zero.h), 12 bytes per
  // parameter of the rank's shard less.
  bool offload_optimizer = false;
};
const char* device_name(DeviceKind kind);  // "cpu", "cuda", "cuda-sim"

// What a rank computes on, as reported at start (train prints a table by node) and used for the
// MFU figures and the balancer's starting weights.
struct DeviceInfo {
  std::string name;           // "NVIDIA H100 80GB HBM3", "CUDA simulator ...", "CPU: <model> (N threads)"
  int sm_count = 0;           // GPU multiprocessors; 0 for the CPU and the simulator
  double memory_bytes = 0;    // device memory; the host's RAM for the CPU and the simulator
  int cc_major = 0, cc_minor = 0;  // compute capability; 0.0 off the GPU
  double gemm_tflops = 0;     // measured matrix-product rate in TFLOP/s: bf16 on the CUDA backend
                              // (4096^3 on a GPU), fp32 BLAS (512^3) on the CPU
  std::string gemm_what;      // e.g. "bf16 4096^3 cuBLASLt"
  // The dense peak the MFU is measured against, in TFLOP/s: a GPU's datasheet bf16 tensor-core
  // figure (hostfile.h's table; 0 for a GPU not in it), the CPU's fp32 FMA peak (cpu_peak_tflops).
  // The measured GEMM rate above is not a peak: a 512^3 product is overhead-bound, and a model's
  // larger products run faster than it (stories15m on a CPU reached 2x it).
  double peak_tflops = 0;
  std::string peak_what;      // e.g. "H100-SXM5-80GB datasheet dense bf16"
};

// Device memory held by a rank's process, for train's step records (`device_peak_bytes`) and the
// GPU check's comparison with the planner. Zeros where a device does not track it.
struct DeviceMemoryUse {
  double allocated_bytes = 0;         // now, through the backend's allocator
  double peak_bytes = 0;              // its high-water mark since the process started
  double driver_used_peak_bytes = 0;  // GPU: the largest used memory the driver reported (context,
                                      // libraries and other processes included); 0 elsewhere
};

// What a device runtime did that can stall the host (allocations, frees, synchronisations,
// copies, cuBLASLt plans built), counted since the process started; a step's share is the
// difference of two readings (`device_calls` of train's step records, docs/formats.md).
struct DeviceCallCounts {
  double allocs = 0, frees = 0, device_syncs = 0, stream_syncs = 0, h2d_copies = 0, d2h_copies = 0,
         blocking_copies = 0, plans_built = 0;
  static constexpr int kFields = 8;
  // The fields in the order above, and their names in the step records.
  std::vector<double> values() const {
    return {allocs, frees, device_syncs, stream_syncs, h2d_copies, d2h_copies, blocking_copies, plans_built};
  }
  static DeviceCallCounts from_values(const double* v);
  static const char* const* names();
  DeviceCallCounts operator-(const DeviceCallCounts& o) const;
};

// The CPU's DeviceInfo with `threads` OpenMP threads (measures the GEMM rate, ~0.1 s): fp32 BLAS, or
// with bf16 oneDNN's bf16 product and, on AMX, the AMX peak (1024 bf16 FLOP/cycle per core).
DeviceInfo cpu_device_info(int threads, Precision precision = Precision::kFp32);

// The fp32 peak of `threads` cores described by /proc/cpuinfo text: threads x the highest clock
// listed ("cpu MHz") x FLOPs per cycle from the vector flags (avx512f: 2 FMA units x 16 lanes x 2
// = 64; avx2 with fma: 32; otherwise SSE, 2 x 4 x 2 = 16). An upper bound (turbo clocks above the
// listed one aside), so an MFU against it stays below 1. 0 when the text lists no clock.
double cpu_peak_tflops(const std::string& cpuinfo, int threads, std::string* what);
// The same for this machine's /proc/cpuinfo.
double host_cpu_peak_tflops(int threads, std::string* what);

class Engine;        // engine.h
class Evaluator;     // engine.h
class FrozenShards;  // zero.h
class Decoder;       // inference.h

// What an accelerator's engine is made with: the model and the options that decide how it runs.
struct DeviceEngineSpec {
  Llama2Config cfg;
  int local_rank = 0;  // picks the GPU among the node's
  Attention attention = Attention::kNative;
  Recompute recompute = Recompute::kNone;
  DeviceCollectives collectives;
  // LoRA at ZeRO 3 (the host model has adapters): the host's shards of the frozen base; else null.
  FrozenShards* frozen_base = nullptr;
};

struct DeviceBackend {
  DeviceKind kind = DeviceKind::cpu;
  // The engine on this process's device (engine.h): the passes and the ZeRO optimizer on device
  // buffers, taking its state from the host's `model` and `zero` (Engine::load_host_state), which
  // stay the staging area of checkpoints.
  std::unique_ptr<Engine> (*make_engine)(const DeviceEngineSpec& spec, Llama2Model& model, ZeroOptimizer& zero) = nullptr;
  // An evaluator (engine.h) with `model`'s weights (and LoRA adapters, applied unmerged) copied to
  // the device; model must outlive it.
  std::unique_ptr<Evaluator> (*make_evaluator)(const Llama2Model& model, int local_rank) = nullptr;
  // A token-by-token decoder (inference.h) with `model`'s weights copied to the device and a KV
  // cache of max_len positions.
  std::unique_ptr<Decoder> (*make_decoder)(const Llama2Model& model, int max_len, int local_rank) = nullptr;
  int (*device_count)() = nullptr;  // devices usable now (0: none, no driver; throws if present but unusable)
  std::string (*report)() = nullptr;  // lines for `llamatrain info` (devices, driver, libraries found)
};

void register_device_backend(const DeviceBackend& backend);
// The report lines of every registered backend that has them, for `llamatrain info`.
std::string device_backends_report();

// "auto" takes cuda when a registered CUDA backend sees a device, the CPU otherwise; "cpu",
// "cuda", "cuda-sim" name one. Throws lt::Error for an unknown name, a backend not built into
// this executable, or cuda without a visible GPU.
// What --device asks for (parsed once, in the CLI); resolve_device turns it into the device a
// process runs on, or throws lt::Error saying why that device is not there.
enum class DeviceChoice { kAuto, kCpu, kCuda, kCudaSim };
const char* device_choice_name(DeviceChoice c);  // "auto", "cpu", "cuda", "cuda-sim"
DeviceKind resolve_device(DeviceChoice choice);
std::unique_ptr<Engine> make_device_engine(DeviceKind kind, const DeviceEngineSpec& spec, Llama2Model& model,
                                           ZeroOptimizer& zero);

// ---- the CPU's bf16 path (--precision bf16: oneDNN, src/backend/cpu/onednn/) ----
// For `llamatrain info`: "oneDNN <version> (<path>), ISA <isa>", or why it cannot be used.
std::string cpu_bf16_report();
// Sets the CPU model's precision for `cmd` (train, eval, generate). For bf16 on a CPU whose oneDNN
// ISA has no AMX, warns on stderr (when say) that it will be slower than fp32 and why. Throws
// lt::Error when oneDNN cannot be loaded.
void set_cpu_precision(Llama2Model& model, Precision p, const char* cmd, bool say);

}  // namespace lt
