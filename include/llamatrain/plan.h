// The cluster planner (`llamatrain plan`): before a job is queued, what each rank of a hostfile
// holds in memory and how long a step and an epoch take, with equal batches and with the batch
// split that follows each rank's speed (DESIGN.md "Heterogeneous ranks").
//
// The model, per optimizer step of B sequences of T tokens cut into M = B / b micro-batches, rank i
// running k_i of them (sum k_i = M):
//
//   compute_i = k_i * b * T * F_exec / R_i           F_exec: FLOPs per token actually executed
//                                                     (6N + 12LCT, plus the recomputed forward)
//   step      = E[max_i compute_i] + t_collectives + t_optimizer
//               (max_i when compute times do not vary; with a calibrated step-to-step variation
//               the expected slowest rank, see expected_max_compute)
//   epoch     = floor(sequences / B) * step          (the trainer's steps per epoch)
//
// R_i is the rank's sustained rate: a GPU type's dense bf16 peak (hostfile.h's spec table) times
// the efficiency factor, a CPU rank's rate per OpenMP thread times its threads, or a calibrated
// rate. Collectives are rings over the slowest link the job crosses (the NIC `nic_gbps` of a
// host when the job spans hosts, the node's GPU interconnect or shared memory when it does not):
//   all-reduce of S bytes:               2 (W-1)/W * S / bw + 2 (W-1) * latency
//   reduce-scatter or all-gather of S:     (W-1)/W * S / bw +   (W-1) * latency
// stage 0: all-reduce(gradients); 1: all-reduce(gradients) + all-gather(parameters);
// 2: reduce-scatter(gradients) + all-gather(parameters). Nothing overlaps with compute (the
// trainer reduces after the rank's last micro-batch). Every constant is in PlanConstants,
// documented where kDefaultPlanConstants is defined (src/runtime/plan.cpp), and can be replaced by
// a calibration fitted from a measured run's metrics (fit_calibration).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llamatrain/balance.h"
#include "llamatrain/config.h"
#include "llamatrain/hostfile.h"
#include "llamatrain/lora.h"
#include "llamatrain/zero.h"

namespace lt {

// A measured rate for one kind of rank: a GPU type, or "cpu" at a number of OpenMP threads.
struct CalibratedRate {
  std::string device;       // GPU type as in the hostfile, or "cpu"
  int threads = 0;          // CPU ranks: OpenMP threads per rank; 0 for GPUs
  double gflops = 0;        // sustained GFLOP/s per rank on F_exec
  int64_t samples = 0;      // rank-steps the rate was measured over
  std::string source;       // the metrics file(s)
};

struct PlanConstants {
  double gpu_efficiency = 0;         // fraction of dense bf16 peak sustained on F_exec
  double gpu_memory_usable = 0;      // fraction of a GPU's memory training may use
  double hbm_efficiency = 0;         // fraction of HBM bandwidth the AdamW step attains
  double adamw_bytes_per_param = 0;  // HBM bytes moved per updated parameter (GPU)
  double cpu_gflops_per_thread = 0;  // uncalibrated CPU rate per OpenMP thread (fp32)
  double cpu_link_gbps = 0;          // ring bandwidth between CPU ranks of one node, GB/s
  double link_efficiency = 0;        // fraction of a GPU link's / NIC's nominal bandwidth a ring attains
  double link_latency_s = 0;         // per ring step
  double compute_cv = 0;             // relative std. deviation of a rank's compute time per step
  double compute_correlation = 0;    // correlation of that noise between two ranks
  double host_memory_gbps = 0;       // --offload-optimizer: a node's host memory bandwidth its ranks' AdamW shares
  double host_copy_gbps = 0;         // --offload-optimizer: device-host copies per GPU per direction, GB/s
  std::vector<CalibratedRate> rates; // measured rates; they win over the defaults
  std::string source = "built-in";   // where the constants came from
};
// The built-in table (documented in plan.cpp).
const PlanConstants& default_plan_constants();

// Intra-node GPU link (NVLink or PCIe), GB/s per direction per GPU, for a GPU type of the spec
// table; 0 for an unknown type.
double gpu_link_gbps(const std::string& gpu_type);

// FLOPs per token executed by training: Llama2Config::flops_per_token plus what recomputation
// repeats (attn: the QKV projections and attention forward, 2 L C (C + 2 kv) + 4 L C T; full: every
// layer's forward but its w2 product, 2 L (2 C^2 + 2 C kv + 2 C F) + 4 L C T).
double executed_flops_per_token(const Llama2Config& cfg, int seq_len, Recompute r);
// Activation bytes of one micro-batch of b sequences of T tokens: `elem_bytes` per stored element
// (2 on the GPU, 4 on the CPU), fp32 for norm/softmax statistics. In every mode this is the
// buffers the model allocates: Llama2Model::activation_bytes for elem_bytes 4, the CUDA backend's
// (bf16 activations, fp32 statistics) for 2.
double plan_activation_bytes(const Llama2Config& cfg, int b, int T, Recompute r, double elem_bytes);

// The expected slowest of ranks whose step compute times are normal with means `mean`, standard
// deviations cv * mean and one correlation between any two (Clark 1961, "The greatest of a finite
// set of random variables": the max of two normals taken pairwise, its moments and its
// correlation with the next). cv = 0 gives max(mean). Ranks with mean 0 (no micro-batch) do not count.
double expected_max_compute(const std::vector<double>& mean, double cv, double correlation);

// Ring collective time of S bytes over W ranks (formulas above); bw in GB/s (1e9 B/s).
double ring_allreduce_s(double bytes, int world, double gbps, double latency_s);
double ring_reduce_scatter_s(double bytes, int world, double gbps, double latency_s);  // = all-gather

struct PlanOptions {
  Llama2Config model;
  std::string model_name;
  int seq_len = 0;
  int64_t global_batch = 0;
  int micro_batch = 0;           // 0: the planner picks (largest that fits and balances best)
  int zero_stage = 1;
  bool bf16_grads = false;       // --grad-reduce-dtype bf16: gradients on the wire and ZeRO 2/3 shards
  int zero3_prefetch = 1;        // GPU ZeRO 3: blocks gathered ahead (train --zero3-prefetch)
  bool offload_optimizer = false;  // GPU ZeRO 1-3: master and Adam on the host (train --offload-optimizer)
  Recompute recompute = Recompute::kNone;
  int64_t train_sequences = 0;   // per epoch
  int np = 0;                    // ranks; 0: every slot of the hostfile
  int cpu_cores = 0;             // cores of a CPU node; 0: this machine's
  int cpu_threads = 0;           // OpenMP threads per CPU rank (plan: OMP_NUM_THREADS, as train takes it);
                                 // 0: the node's cores / its ranks (train's default); a host's threads= wins
  Slowdown slowdown;             // rank = -1: none
  LoraConfig lora;               // rank > 0: LoRA adapters on a frozen base (train --lora-rank)
};

// One MPI rank as Open MPI's default by-slot mapping places it.
struct PlanRank {
  int rank = 0;
  std::string host;
  int host_line = 0;
  std::string device;       // GPU type, or "cpu"
  bool gpu = false;
  int threads = 0;          // CPU: OpenMP threads, as train would run them (threads_source)
  std::string threads_source;  // CPU: "threads= of FILE:LINE", "OMP_NUM_THREADS" or "C cores / R rank(s)"
  double gflops = 0;        // sustained rate used (slowdown applied)
  std::string rate_source;  // "peak x efficiency", "calibrated (...)", ...
  double capacity_bytes = 0;  // usable memory; 0: not known (CPU)
  MemoryRow memory;         // at the chosen micro-batch of the balanced plan
  bool fits = true;
  int max_micro_batch = 0;  // largest micro-batch that fits (0: none; -1: unknown, CPU)
};

struct SplitPlan {
  int micro_batch = 0;
  std::vector<int> k;        // micro-batches per rank
  double compute_s = 0;      // slowest rank
  double collectives_s = 0;
  double optimizer_s = 0;
  double step_s = 0;
  double epoch_s = 0;
};

struct PlanResult {
  std::vector<PlanRank> ranks;
  double flops_per_token = 0;  // F_exec
  int64_t steps_per_epoch = 0;
  double ring_gbps = 0;        // effective ring bandwidth (efficiency applied)
  std::string ring_link;       // which link that is
  SplitPlan equal, balanced;
  bool fits = true;
  std::vector<std::string> notes;
};

PlanResult make_plan(const Hostfile& hf, const PlanOptions& opt, const PlanConstants& c);

// A step or epoch time as plans print it: "0.35 s", "5.8 min" from 2 minutes, "4.2 h" from 3 hours.
std::string plan_duration_text(double seconds);

// For a plan that does not fit: the changes of opt that would, each alone and then all memory
// savers together, as "--recompute full: micro-batch 1 fits, an epoch takes 1.2 h" (empty when
// none does). The candidates: recomputation, a higher ZeRO stage, --offload-optimizer on GPUs.
std::vector<std::string> what_would_fit(const Hostfile& hf, const PlanOptions& opt, const PlanConstants& c);

// ---- calibration --------------------------------------------------------------------------
// Reads a train --metrics JSONL file. Errors name "<path>:<line>: <problem>" (bad JSON, a missing
// or mistyped field) or "<path>: <problem>" (no memory record, no step records).
struct MetricsStep {
  int64_t step = 0;
  int64_t tokens = 0;
  double step_ms = 0;
  std::vector<int> split;
  std::vector<double> rank_compute_ms, rank_wait_ms;
};
struct MetricsRun {
  std::string path;
  int world_size = 0, zero_stage = 0;
  int64_t n_params = 0;
  std::vector<int> threads;  // per rank, the OpenMP threads the run recorded ("devices" record); empty: not recorded
  std::vector<MetricsStep> steps;
  std::vector<double> epoch_time_s;
};
MetricsRun read_metrics(const std::string& path);

struct CalibrationInput {
  Llama2Config model;
  std::string model_name;
  int seq_len = 0;
  Recompute recompute = Recompute::kNone;  // what the run executed (its train --recompute)
  Slowdown slowdown;                       // the run's --simulate-slowdown, undone in the fit
  int cpu_cores = 0;
  int cpu_threads = 0;                     // as PlanOptions', for runs that do not record their threads
};
// Fits, from the runs' step records (the first step of each run skipped: allocation, cold caches):
//  * each rank's rate = its FLOPs / its compute time (rank_compute_ms; one rank: step_ms), both
//    summed over the steps (an epoch is a sum of step times); one entry per device kind (GPU
//    type, or cpu at the thread count the run recorded, else the one the planner's layout gives),
//    the median over its ranks;
//  * from runs with W > 1: the ring bandwidth that explains step - max_i compute_i (all of a
//    step's non-compute time is charged to the collectives), as cpu_link_gbps for a CPU node or
//    link_efficiency for GPU links; and the variation of the ranks' compute time from step to
//    step (compute_cv, the RMS of each rank's coefficient of variation) and its correlation
//    between ranks (compute_correlation, the mean over rank pairs).
// The other constants stay those of `base`. `report` receives one line per fitted quantity.
PlanConstants fit_calibration(const std::vector<MetricsRun>& runs, const Hostfile& hf, const CalibrationInput& in,
                              const PlanConstants& base, std::vector<std::string>* report);

// Calibration files: {"format": "llamatrain-plan-calibration", "format_version": 1,
// "constants": {<name>: number, ...}, "rates": [{"device", "threads", "gflops", "samples", "source"}]}.
std::string calibration_to_json(const PlanConstants& c);
// Reads one; unknown keys and mistyped fields are errors naming the file and the field.
PlanConstants read_calibration(const std::string& path, const PlanConstants& base);

// The hostfile used when none is given: this machine as one CPU node with `cores` slots.
Hostfile local_cpu_hostfile(int cores);

}  // namespace lt
