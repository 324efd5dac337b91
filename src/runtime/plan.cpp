// The cluster planner's model (see plan.h for the formulas) and its one table of constants.
#include "llamatrain/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>

#include "llamatrain/error.h"
#include "llamatrain/runtime.h"

namespace lt {

// ---- the constants -------------------------------------------------------------------------
//
// | constant              | value | meaning and source                                                |
// |-----------------------|-------|-------------------------------------------------------------------|
// | gpu_efficiency        | 0.45  | sustained fraction of a GPU type's dense bf16 peak on the FLOPs   |
// |                       |       | training executes (forward, backward, recomputation). Megatron-LM |
// |                       |       | reports 41-48% and torchtitan 33-39% MFU for Llama-sized models   |
// |                       |       | (DESIGN.md's target range); 0.45 lies inside. NOT fitted to the   |
// |                       |       | reference deployment's figures, but chosen knowing them: with the |
// |                       |       | assumptions of docs/planning.md both are met within 25%|
// |                       |       | for about 0.43 <= e <= 0.49 (0.40 would miss the 4xA100 one: 1.31x)|
// | gpu_memory_usable     | 0.90  | of the nominal memory: CUDA context, NCCL buffers, allocator slack|
// | hbm_efficiency        | 0.80  | of HBM bandwidth for the AdamW step (DESIGN.md: memory-bound      |
// |                       |       | kernels at >= 80% of measured bandwidth)                          |
// | adamw_bytes_per_param | 30    | fp32 master, m, v read and written (24) + fp32 gradient read (4) +|
// |                       |       | bf16 working copy written (2)                                     |
// | cpu_gflops_per_thread | 10    | uncalibrated CPU rate per OpenMP thread on fp32 training: ~10% of |
// |                       |       | an AVX2 core's FMA peak (2 x 8 lanes x 2 FLOP x ~3 GHz = 96); a   |
// |                       |       | guess to be replaced by `plan --calibrate` (it measured 8 on the  |
// |                       |       | 2-core development machine with the tiny model)                   |
// | cpu_link_gbps         | 5     | ring bandwidth between CPU ranks of one node (MPI shared memory:  |
// |                       |       | one memcpy per ring step); replaced by calibration                |
// | link_efficiency       | 0.80  | of a link's nominal bandwidth that a ring all-reduce attains      |
// |                       |       | (nccl-tests bus bandwidth, typically 75-90% of line rate)         |
// | link_latency_s        | 20e-6 | per ring step (NCCL over TCP/RoCE: tens of microseconds)          |
// | compute_cv            | 0     | step-to-step variation of a rank's compute time (relative std.    |
// |                       |       | dev.): none assumed; calibration measures it (a shared CPU shows  |
// |                       |       | 0.2-0.4, so the slowest of equal ranks is ~10% slower than each)  |
// | compute_correlation   | 0     | of that variation between ranks (calibrated; can be negative when |
// |                       |       | ranks compete for the same cores)                                 |
// | host_memory_gbps      | 100   | --offload-optimizer: the host memory bandwidth a node's ranks     |
// |                       |       | share for their AdamW updates (adamw_bytes_per_param each). A     |
// |                       |       | two-socket DDR5 server streams 300-600 GB/s nominal; an OpenMP    |
// |                       |       | AdamW of 8 ranks at once attains far less: a conservative guess,  |
// |                       |       | not measured (no such node here)                                  |
// | host_copy_gbps        | 12    | --offload-optimizer: device-host copies per GPU and direction:    |
// |                       |       | the offload copies pageable host memory (cudaMemcpy), 10-25 GB/s  |
// |                       |       | on PCIe Gen4/Gen5 hosts; the low end, not measured                |
//
// GPU peaks and memory come from hostfile.cpp's spec table; intra-node links from gpu_link_gbps.
const PlanConstants& default_plan_constants() {
  static const PlanConstants c = [] {
    PlanConstants k;
    k.gpu_efficiency = 0.45;
    k.gpu_memory_usable = 0.90;
    k.hbm_efficiency = 0.80;
    k.adamw_bytes_per_param = 30;
    k.cpu_gflops_per_thread = 10;
    k.cpu_link_gbps = 5;
    k.link_efficiency = 0.80;
    k.link_latency_s = 20e-6;
    k.compute_cv = 0;
    k.compute_correlation = 0;
    k.host_memory_gbps = 100;
    k.host_copy_gbps = 12;
    k.source = "built-in";
    return k;
  }();
  return c;
}

double gpu_link_gbps(const std::string& gpu_type) {
  // GB/s per direction per GPU between the GPUs of one node (NVIDIA datasheets): NVLink 3 on
  // A100 SXM (12 links x 25 GB/s), NVLink 4 on H100/H200 SXM (18 x 25); PCIe 4.0 x16 on A100 PCIe,
  // PCIe 5.0 x16 on H100 PCIe and NVL (their NVLink bridges join pairs only, so a ring over the
  // node crosses PCIe).
  static const std::map<std::string, double> table = {
      {"a100-sxm4-80gb", 300}, {"a100-sxm4-40gb", 300}, {"a100-pcie-80gb", 32}, {"a100-pcie-40gb", 32},
      {"h100-sxm5-80gb", 450}, {"h100-pcie-80gb", 64},  {"h100-nvl-94gb", 64},  {"h200", 450},
  };
  const auto it = table.find(ascii_lower(gpu_type));
  return it == table.end() ? 0.0 : it->second;
}

double executed_flops_per_token(const Llama2Config& cfg, int T, Recompute r) {
  const double C = cfg.dim, F = cfg.hidden_dim, KV = cfg.kv_dim(), L = cfg.n_layers;
  double f = cfg.flops_per_token(T);
  // Forward attention (scores and values) is 4 C T per token per layer, as in flops_per_token.
  if (r == Recompute::kAttn) f += 2.0 * L * C * (C + 2 * KV) + 4.0 * L * C * T;
  // The layer's forward again up to the SwiGLU: wq, wo (C x C), wk, wv (C x kv), w1, w3 (C x F),
  // attention; not w2, whose output (the layer's output) is kept (llama2_pass.h).
  if (r == Recompute::kFull) f += 2.0 * L * (2 * C * C + 2 * C * KV + 2 * C * F) + 4.0 * L * C * T;
  return f;
}

namespace {

// What the optimizer trains and the ranks reduce: the model's parameters, or LoRA's adapters.
size_t trained_parameters(const PlanOptions& o) {
  return o.lora.enabled() ? LoraLayout(o.model, o.lora).total() : size_t(o.model.num_parameters());
}

// LoRA's FLOPs per token (LoraLayout::flops_per_token_delta): no weight gradients of the base, the
// adapters' products.
double lora_flops_per_token(const PlanOptions& o, double full) {
  return o.lora.enabled() ? full + LoraLayout(o.model, o.lora).flops_per_token_delta() : full;
}

// The ZeRO stage of what the optimizer trains: LoRA's adapters take stage 1 at stages 2 and 3 (their
// gradients stay whole; train_setup.cpp make_optimizer), the model's the stage asked for.
int trained_stage(const PlanOptions& o) { return o.lora.enabled() ? std::min(o.zero_stage, 1) : o.zero_stage; }

// A rank's activations with LoRA: the pass's plus each adapter's kept u (r values per token).
double lora_activation_bytes(const PlanOptions& o, bool gpu, int b) {
  const double e = gpu ? 2.0 : 4.0;
  return plan_activation_bytes(o.model, b, o.seq_len, o.recompute, e) +
         e * double(b) * o.seq_len * double(LoraLayout(o.model, o.lora).sites().size()) * o.lora.rank;
}

}  // namespace

double plan_activation_bytes(const Llama2Config& cfg, int b, int T, Recompute r, double e) {
  // Per token, the buffers the pass allocates (src/model/llama2_pass.h, for_each_buffer), with
  // activations in `e` bytes and the norm and softmax statistics in fp32. One layer's worth:
  // xn1, q, att, x2, xn2 (5C), k, v (2 kv), h1, h3, hs (3F); rstd1, rstd2 and the attention's
  // log-sum-exp per head (2 + H). Of these, attn recomputes q, att, k, v and the log-sum-exp.
  const double N = double(b) * T, C = cfg.dim, F = cfg.hidden_dim, KV = cfg.kv_dim();
  const double L = cfg.n_layers, V = cfg.vocab_size, H = cfg.n_heads;
  const double layer = (5 * C + 2 * KV + 3 * F) * e + (2 + H) * 4;
  const double attention = (2 * C + 2 * KV) * e + H * 4;
  double kept = 0;
  switch (r) {
    case Recompute::kNone: kept = L * layer; break;
    // The attention's buffers are refilled from xn1: one layer's worth of them at a time.
    case Recompute::kAttn: kept = L * (layer - attention) + attention; break;
    // Only the residual stream (below) is kept; one layer is recomputed at a time in backward.
    case Recompute::kFull: kept = layer; break;
  }
  // The residual stream (L+1 layer inputs and outputs), the final norm (C) and the logits (V) in
  // `e` bytes (the CUDA backend keeps bf16 logits), its rstd and the loss and log-sum-exp per
  // token (3, fp32), and the backward's scratch for one layer (dx, dtmp, dtmp2, datt, dq: 5C; dk,
  // dv; dh1, dh3, dhs).
  const double rest = (L + 1) * C * e + C * e + V * e + 3 * 4 + (5 * C + 2 * KV + 3 * F) * e;
  return N * (kept + rest);
}

double expected_max_compute(const std::vector<double>& mean, double cv, double rho) {
  // Running maximum Y of the ranks so far: its mean m, standard deviation s, and its correlation
  // r_j with each rank j still to come (all start at rho).
  double m = 0, s = 0;
  bool have = false;
  std::vector<double> r_next(mean.size(), rho);
  for (size_t i = 0; i < mean.size(); ++i) {
    const double mu = mean[i], sd = cv * mean[i];
    if (mu <= 0) continue;
    if (!have) {
      m = mu, s = sd, have = true;
      continue;
    }
    const double r = r_next[i];
    const double theta2 = s * s + sd * sd - 2 * r * s * sd;
    if (theta2 <= 1e-30 * (m * m + mu * mu)) {  // no spread: the larger mean wins outright
      if (mu > m) m = mu, s = sd;
      continue;
    }
    const double theta = std::sqrt(theta2), a = (m - mu) / theta;
    const double Pa = 0.5 * std::erfc(-a / std::sqrt(2.0)), Pb = 1 - Pa;
    const double pa = std::exp(-0.5 * a * a) / std::sqrt(2 * 3.14159265358979323846);
    const double m1 = m * Pa + mu * Pb + theta * pa;
    const double m2 = (m * m + s * s) * Pa + (mu * mu + sd * sd) * Pb + (m + mu) * theta * pa;
    const double s1 = std::sqrt(std::max(0.0, m2 - m1 * m1));
    // Corr(max(Y, X_i), X_j) = (s r_Yj Pa + sd rho Pb) / s1 for the ranks j still to come.
    for (size_t j = i + 1; j < mean.size(); ++j)
      r_next[j] = s1 > 0 ? std::clamp((s * r_next[j] * Pa + sd * rho * Pb) / s1, -1.0, 1.0) : rho;
    m = m1, s = s1;
  }
  return m;
}

double ring_allreduce_s(double bytes, int world, double gbps, double latency_s) {
  if (world <= 1) return 0;
  return 2.0 * (world - 1) / world * bytes / (gbps * 1e9) + 2.0 * (world - 1) * latency_s;
}

double ring_reduce_scatter_s(double bytes, int world, double gbps, double latency_s) {
  if (world <= 1) return 0;
  return double(world - 1) / world * bytes / (gbps * 1e9) + double(world - 1) * latency_s;
}

Hostfile local_cpu_hostfile(int cores) {
  return parse_hostfile_text(strcat("localhost slots=", std::max(1, cores), "\n"), "<this machine>");
}

namespace {

int node_cores(const PlanOptions& o) { return o.cpu_cores > 0 ? o.cpu_cores : hardware_cores(); }

// A CPU rank's OpenMP threads as train would run it: its host line's threads=, else OMP_NUM_THREADS
// (cpu_threads), else the node's cores / its ranks (default_threads in runtime.h).
void set_cpu_threads(PlanRank& r, const Hostfile& hf, const HostEntry& h, int cpu_threads, int cores, int here) {
  if (h.threads > 0) {
    r.threads = h.threads;
    r.threads_source = strcat("threads= of ", hf.path, ":", h.line);
  } else if (cpu_threads > 0) {
    r.threads = cpu_threads;
    r.threads_source = "OMP_NUM_THREADS";
  } else {
    r.threads = std::max(1, cores / here);
    r.threads_source = strcat(cores, " cores / ", here, " rank(s)");
  }
}

// Ranks by slot (Open MPI's default mapping): host after host, `slots` ranks each.
std::vector<PlanRank> place_ranks(const Hostfile& hf, const PlanOptions& o) {
  const int total = hf.total_slots();
  const int np = o.np > 0 ? o.np : total;
  if (np > total) fail(strcat("--np ", np, ": ", hf.path, " has only ", total, " slot(s)"));
  const int cores = node_cores(o);
  std::vector<PlanRank> ranks;
  for (const HostEntry& h : hf.hosts) {
    const int here = std::min(h.slots, np - int(ranks.size()));
    if (here <= 0) break;
    if (!h.gpu.empty()) {
      require_gpu_spec(h.gpu, strcat(hf.path, ":", h.line, ": gpu=", h.gpu));
      if (h.gpus != h.slots)
        fail(strcat(hf.path, ":", h.line, ": slots=", h.slots, " but gpus=", h.gpus,
                    "; the planner expects one rank per GPU (slots = gpus)"));
    }
    for (int i = 0; i < here; ++i) {
      PlanRank r;
      r.rank = int(ranks.size());
      r.host = h.host;
      r.host_line = h.line;
      r.gpu = !h.gpu.empty();
      r.device = r.gpu ? find_gpu_spec(h.gpu)->name : "cpu";
      if (!r.gpu) set_cpu_threads(r, hf, h, o.cpu_threads, cores, here);
      ranks.push_back(r);
    }
  }
  return ranks;
}

// A CPU node whose ranks run more threads than it has cores: the rate per thread assumes a core each.
void note_threads_over_cores(const std::vector<PlanRank>& ranks, int cores, std::vector<std::string>* notes) {
  std::map<std::string, std::pair<int, int>> by_host;  // host -> (ranks, threads)
  for (const PlanRank& r : ranks)
    if (!r.gpu) by_host[r.host].first += 1, by_host[r.host].second += r.threads;
  for (const auto& [host, n] : by_host)
    if (n.second > cores)
      notes->push_back(strcat(host, ": ", n.first, " cpu rank(s) run ", n.second, " threads on ", cores,
                              " cores (--cpu-cores, default this machine's); the rate per thread assumes a core "
                              "each, so expect a slower run than planned"));
}

// The rate of a rank from the calibration, else from the built-in constants.
void assign_rate(PlanRank& r, const PlanConstants& c, std::vector<std::string>* notes) {
  if (r.gpu) {
    for (const auto& cr : c.rates)
      if (ascii_lower(cr.device) == ascii_lower(r.device)) {
        r.gflops = cr.gflops;
        r.rate_source = strcat("calibrated (", cr.source, ")");
        return;
      }
    const GpuSpec* s = find_gpu_spec(r.device);
    r.gflops = s->bf16_tflops * 1e3 * c.gpu_efficiency;
    r.rate_source = strcat("peak ", s->bf16_tflops, " TFLOP/s x efficiency ", c.gpu_efficiency);
    return;
  }
  const CalibratedRate* nearest = nullptr;
  for (const auto& cr : c.rates) {
    if (cr.device != "cpu") continue;
    if (cr.threads == r.threads) {
      r.gflops = cr.gflops;
      r.rate_source = strcat("calibrated at ", cr.threads, " thread(s) (", cr.source, ")");
      return;
    }
    if (!nearest || std::abs(cr.threads - r.threads) < std::abs(nearest->threads - r.threads)) nearest = &cr;
  }
  if (nearest) {
    r.gflops = nearest->gflops / nearest->threads * r.threads;
    r.rate_source = strcat("calibrated at ", nearest->threads, " thread(s), scaled to ", r.threads);
    const std::string note = strcat("cpu ranks run ", r.threads, " thread(s) but the calibration measured ",
                                     nearest->threads, "; its rate was scaled per thread (calibrate at the layout you "
                                     "will run: threading does not scale linearly)");
    if (std::find(notes->begin(), notes->end(), note) == notes->end()) notes->push_back(note);
    return;
  }
  r.gflops = c.cpu_gflops_per_thread * r.threads;
  r.rate_source = strcat("default ", c.cpu_gflops_per_thread, " GFLOP/s per thread x ", r.threads, " (uncalibrated)");
}

// Memory of each rank at micro-batch b: zero.h's accounting, the CPU's (fp32 everywhere) or the
// CUDA backend's (device_memory_table: bf16 working weights, fp32 gradients, master and Adam, stage
// 2 and 3's slots). With bf16 gradients, the shards of stages 2 and 3 take 2 bytes per
// element (grad_shard.h), on the CPU and the device alike.
std::vector<MemoryRow> rank_memory(const std::vector<PlanRank>& ranks, const PlanOptions& o, int b) {
  const int W = int(ranks.size());
  const ParameterLayout layout(o.model);
  if (o.lora.enabled()) {  // zero.h's LoRA accounting, the CPU's or a GPU's per rank
    const size_t adapters = LoraLayout(o.model, o.lora).total();
    const auto table = [&](bool gpu) {
      return lora_memory_table(layout, adapters, W, o.zero_stage, lora_activation_bytes(o, gpu, b), gpu, o.zero3_prefetch);
    };
    const std::vector<MemoryRow> cpu = table(false), gpu = table(true);
    std::vector<MemoryRow> rows;
    for (int i = 0; i < W; ++i) rows.push_back((ranks[size_t(i)].gpu ? gpu : cpu)[size_t(i)]);
    return rows;
  }
  const double shard_grad_bytes = o.bf16_grads ? 2.0 : 4.0;
  const std::vector<MemoryRow> cpu = memory_table(size_t(o.model.num_parameters()), W, o.zero_stage,
                                                  plan_activation_bytes(o.model, b, o.seq_len, o.recompute, 4),
                                                  zero_block_bytes(layout, o.zero_stage), shard_grad_bytes);
  const std::vector<MemoryRow> gpu =
      device_memory_table(layout, W, o.zero_stage, plan_activation_bytes(o.model, b, o.seq_len, o.recompute, 2),
                          shard_grad_bytes, o.zero3_prefetch, o.offload_optimizer);
  std::vector<MemoryRow> rows;
  for (int i = 0; i < W; ++i) rows.push_back(ranks[size_t(i)].gpu ? gpu[size_t(i)] : cpu[size_t(i)]);
  return rows;
}

SplitPlan evaluate(const std::vector<PlanRank>& ranks, const PlanOptions& o, const PlanConstants& c, double F, int b,
                   bool balanced) {
  const int W = int(ranks.size());
  SplitPlan p;
  p.micro_batch = b;
  const int M = int(o.global_batch / b);
  std::vector<double> t(static_cast<size_t>(W));
  for (int i = 0; i < W; ++i) t[size_t(i)] = double(b) * o.seq_len * F / (ranks[size_t(i)].gflops * 1e9);
  p.k = split_by_weights(M, std::vector<double>(size_t(W), 1.0));
  if (balanced && M >= W) p.k = propose_rebalance(p.k, t, 0.0).split;
  std::vector<double> mean(static_cast<size_t>(W));
  for (int i = 0; i < W; ++i) mean[size_t(i)] = p.k[size_t(i)] * t[size_t(i)];
  p.compute_s = W > 1 ? expected_max_compute(mean, c.compute_cv, c.compute_correlation) : predicted_step_time(p.k, t);
  return p;
}

// The AdamW step on what each rank owns, the slowest rank's. GPU: memory-bound on HBM; with
// --offload-optimizer on the host instead, the node's ranks sharing its host_memory_gbps, plus the
// gradient shard copied down and the bf16 weights copied up at host_copy_gbps; LoRA's adapters
// always on the host, their whole gradients copied down and bf16 copy up. CPU: inside the
// calibrated rates.
double optimizer_seconds(const std::vector<PlanRank>& ranks, const PlanOptions& o, const PlanConstants& c,
                         size_t padded) {
  const int W = int(ranks.size());
  const double owned = trained_stage(o) == 0 ? double(trained_parameters(o)) : double(ShardLayout(padded, W).shard);
  std::map<int, int> on_node;  // ranks per hostfile line
  for (const PlanRank& r : ranks) ++on_node[r.host_line];
  // The gradient crosses as fp32, or as the bf16 shard of stages 2 and 3 with bf16 gradients.
  const double grad_bytes = o.bf16_grads && o.zero_stage >= 2 ? 2.0 : 4.0;
  double slowest = 0;
  for (const PlanRank& r : ranks) {
    if (!r.gpu) continue;
    double t = owned * c.adamw_bytes_per_param / (find_gpu_spec(r.device)->hbm_gbps * 1e9 * c.hbm_efficiency);
    const double host_update = owned * c.adamw_bytes_per_param / (c.host_memory_gbps * 1e9 / on_node[r.host_line]);
    if (o.lora.enabled()) t = host_update + double(trained_parameters(o)) * (4.0 + 2.0) / (c.host_copy_gbps * 1e9);
    else if (o.offload_optimizer) t = host_update + owned * (grad_bytes + 2.0) / (c.host_copy_gbps * 1e9);
    slowest = std::max(slowest, t);
  }
  return slowest;
}

// The options make_plan refuses, each with what was expected.
void check_plan_options(const PlanOptions& o) {
  o.model.validate();
  if (o.seq_len <= 0) fail(strcat("--seq-len ", o.seq_len, ": expected > 0"));
  if (o.global_batch <= 0) fail(strcat("--global-batch ", o.global_batch, ": expected > 0"));
  if (o.zero_stage < 0 || o.zero_stage > 3) fail(strcat("--zero ", o.zero_stage, ": expected 0, 1, 2 or 3"));
  if (o.offload_optimizer && o.lora.enabled())
    fail("--offload-optimizer with --lora-rank: the adapters' optimizer already runs on the host");
  if (o.offload_optimizer && o.zero_stage == 0)
    fail("--offload-optimizer needs --zero 1, 2 or 3 (each rank offloads its shard of the optimizer state)");
  if (o.micro_batch < 0) fail(strcat("--batch-size ", o.micro_batch, ": expected > 0"));
  if (o.micro_batch > 0 && o.global_batch % o.micro_batch != 0)
    fail(strcat("--global-batch ", o.global_batch, " is not a multiple of --batch-size ", o.micro_batch,
                " (every rank runs whole micro-batches of one shape)"));
  if (o.train_sequences <= 0) fail(strcat("the epoch holds ", o.train_sequences, " sequences; expected > 0"));
  if (o.lora.enabled()) o.lora.validate();
}

// The candidate micro-batches (--batch-size, or the divisors of the global batch that give every
// rank one and fit every rank's memory), setting each rank's max_micro_batch; when none fits,
// res->fits is false, a note says so, and micro-batch 1 is the one planned.
std::vector<int> micro_batch_candidates(const PlanOptions& o, PlanResult* res) {
  const int W = int(res->ranks.size());
  // The largest micro-batch each rank can hold: memory is static + b x activations(1).
  const std::vector<MemoryRow> mem1 = rank_memory(res->ranks, o, 1);
  int max_b = int(std::min<int64_t>(o.global_batch, 1 << 30));
  for (int i = 0; i < W; ++i) {
    PlanRank& r = res->ranks[size_t(i)];
    const MemoryRow& m = mem1[size_t(i)];
    if (r.capacity_bytes <= 0) {
      r.max_micro_batch = -1;
      continue;
    }
    const double room = r.capacity_bytes - (m.params + m.grads + m.optimizer + m.gathered);
    r.max_micro_batch = room < m.activations ? 0 : int(std::min(room / m.activations, 1e9));
    max_b = std::min(max_b, r.max_micro_batch);
  }

  // Candidate micro-batches: divisors of B (every rank gets at least one when B / b >= W).
  std::vector<int> candidates;
  if (o.micro_batch > 0) {
    candidates.push_back(o.micro_batch);
  } else {
    for (int b = 1; b <= o.global_batch; ++b)
      if (o.global_batch % b == 0 && o.global_batch / b >= W && b <= max_b) candidates.push_back(b);
    if (candidates.empty() && max_b >= 1) {
      // Memory is not the limit: the global batch gives some ranks no micro-batch at all.
      res->notes.push_back(strcat("the global batch of ", o.global_batch, " is smaller than the ", W,
                                  " ranks: some ranks get no micro-batch; predicted with micro-batch 1"));
      candidates.push_back(1);
    } else if (candidates.empty()) {
      res->fits = false;
      res->notes.push_back(strcat("no micro-batch fits every rank's memory (largest that fits the smallest: ", max_b,
                                  "); predicted with micro-batch 1"));
      candidates.push_back(1);
    }
  }
  return candidates;
}

// The ring bandwidth of the collectives, GB/s: the slowest link the job crosses (the hosts' NICs
// when it spans hosts, the node's GPU link or shared memory when it does not); 0 for one rank.
// Names the link in res->ring_link.
double ring_bandwidth(const Hostfile& hf, const PlanConstants& c, PlanResult* res) {
  const int W = int(res->ranks.size());
  std::vector<const HostEntry*> used;
  for (const HostEntry& h : hf.hosts)
    for (const PlanRank& r : res->ranks)
      if (r.host_line == h.line) {
        used.push_back(&h);
        break;
      }
  double bw = 0;
  if (W > 1) {
    if (used.size() == 1) {
      const HostEntry& h = *used[0];
      if (h.gpu.empty()) {
        bw = c.cpu_link_gbps;
        res->ring_link = strcat("shared memory of ", h.host, " (cpu_link_gbps ", c.cpu_link_gbps, ")");
      } else {
        bw = gpu_link_gbps(h.gpu) * c.link_efficiency;
        res->ring_link = strcat(h.gpu, " intra-node link of ", h.host, ", ", gpu_link_gbps(h.gpu), " GB/s x ",
                                c.link_efficiency);
      }
    } else {
      for (const HostEntry* h : used) {
        if (h->nic_gbps <= 0)
          fail(strcat(hf.path, ":", h->line, ": host ", h->host,
                      " has no nic_gbps= annotation; a job across hosts needs the network speed (e.g. # nic_gbps=100)"));
        double link = h->nic_gbps / 8.0 * c.link_efficiency;
        std::string what = strcat(h->nic_gbps, " Gb/s NIC of ", h->host, " x ", c.link_efficiency);
        if (!h->gpu.empty() && gpu_link_gbps(h->gpu) * c.link_efficiency < link) {
          link = gpu_link_gbps(h->gpu) * c.link_efficiency;
          what = strcat(h->gpu, " intra-node link of ", h->host);
        }
        if (bw == 0 || link < bw) bw = link, res->ring_link = what;
      }
    }
  }
  return bw;
}

}  // namespace

void note_without_prefetch(const Hostfile& hf, const PlanOptions& o, const PlanConstants& c, PlanResult* res);
void note_with_offload(const Hostfile& hf, const PlanOptions& o, const PlanConstants& c, PlanResult* res);

PlanResult make_plan(const Hostfile& hf, const PlanOptions& o, const PlanConstants& c) {
  check_plan_options(o);
  PlanResult res;
  res.ranks = place_ranks(hf, o);
  note_threads_over_cores(res.ranks, node_cores(o), &res.notes);
  const int W = int(res.ranks.size());
  if (o.slowdown.rank >= W)
    fail(strcat("--simulate-slowdown: rank ", o.slowdown.rank, " is not in [0, ", W, ")"));
  for (PlanRank& r : res.ranks) {
    assign_rate(r, c, &res.notes);
    if (r.rank == o.slowdown.rank && o.slowdown.factor > 1) {
      r.gflops /= o.slowdown.factor;
      r.rate_source += strcat(", SIMULATED ", o.slowdown.factor, "x slowdown");
    }
    if (r.gpu) r.capacity_bytes = find_gpu_spec(r.device)->memory_gib * double(1ull << 30) * c.gpu_memory_usable;
  }
  res.flops_per_token = lora_flops_per_token(o, executed_flops_per_token(o.model, o.seq_len, o.recompute));
  res.steps_per_epoch = o.train_sequences / o.global_batch;
  if (res.steps_per_epoch == 0)
    fail(strcat("the epoch holds ", o.train_sequences, " sequences, fewer than one global batch of ", o.global_batch));

  const std::vector<int> candidates = micro_batch_candidates(o, &res);
  const bool any_gpu = std::any_of(res.ranks.begin(), res.ranks.end(), [](const PlanRank& r) { return r.gpu; });
  const double bw = ring_bandwidth(hf, c, &res);
  res.ring_gbps = bw;
  const size_t padded = ShardLayout(trained_parameters(o), W).padded;
  // Gradients are reduced in fp32 (bf16 with --grad-reduce-dtype bf16); the working copy is
  // all-gathered in bf16 on GPUs (the device optimizer writes it) and in fp32 on CPUs. An
  // all-gather moves the bytes of a reduce-scatter.
  const double gw = o.bf16_grads ? 2.0 : 4.0;
  // The weights gathered after the update: a GPU's bf16 copy, or fp32 from the host (the CPU, and
  // LoRA's adapters everywhere).
  const double grad_bytes = gw * double(padded), gather_bytes = (any_gpu && !o.lora.enabled() ? 2.0 : 4.0) * double(padded);
  double coll = 0;
  if (W > 1) {
    if (trained_stage(o) == 0) coll = ring_allreduce_s(grad_bytes, W, bw, c.link_latency_s);
    // Stage 1 reduce-scatters the gradients once per step and all-gathers the weights.
    if (trained_stage(o) == 1)
      coll = ring_reduce_scatter_s(grad_bytes, W, bw, c.link_latency_s) + ring_reduce_scatter_s(gather_bytes, W, bw, c.link_latency_s);
  }
  const double opt_s = optimizer_seconds(res.ranks, o, c, padded);
  // Stages 2 and 3 (gradient shards only) reduce every micro-batch round (the
  // most micro-batches of any rank): a reduce-scatter of the fp32 gradient and, stage 3, the
  // gathers of the working weights for forward and for backward (not the embeddings' for
  // backward); stage 2 then all-gathers the updated weights once. LoRA: the adapters as at stage 1
  // (coll) and, at stage 3, the gathers of the frozen base every round.
  const ParameterLayout layout(o.model);
  auto collectives = [&](const SplitPlan& p) {
    if (W <= 1 || o.zero_stage < 2 || (o.lora.enabled() && o.zero_stage < 3)) return coll;
    const double n = double(o.model.num_parameters()), wb = any_gpu ? 2.0 : 4.0;
    const double emb = layout.tied() ? 0.0 : double(layout.blocks[0].size());
    double round = o.lora.enabled() ? 0.0 : ring_reduce_scatter_s(gw * n, W, bw, c.link_latency_s);
    if (o.zero_stage == 3)
      round += ring_reduce_scatter_s(wb * n, W, bw, c.link_latency_s) +
               ring_reduce_scatter_s(wb * (n - emb), W, bw, c.link_latency_s);
    const int rounds = p.k.empty() ? 1 : *std::max_element(p.k.begin(), p.k.end());
    if (o.lora.enabled()) return coll + rounds * round;
    return rounds * round + (o.zero_stage == 2 ? ring_reduce_scatter_s(gather_bytes, W, bw, c.link_latency_s) : 0.0);
  };
  // Of the candidates, the largest micro-batch whose compute + collectives time is within 2% of
  // the best one: the model's efficiency does not depend on the micro-batch, a real device's falls
  // with small ones (fewer, larger GEMMs), so a slightly coarser split is worth more than it
  // costs here; and where the collectives run every micro-batch round (above) fewer rounds win.
  auto best = [&](bool balanced) {
    std::vector<SplitPlan> all;
    double fastest = 1e300;
    for (int b : candidates) {
      all.push_back(evaluate(res.ranks, o, c, res.flops_per_token, b, balanced));
      all.back().collectives_s = collectives(all.back());
      // Where the collectives run every round, the balanced split's extra rounds on the fast
      // ranks can cost more than it saves: then the balanced plan is the equal split.
      if (balanced) {
        SplitPlan equal = evaluate(res.ranks, o, c, res.flops_per_token, b, false);
        equal.collectives_s = collectives(equal);
        if (equal.compute_s + equal.collectives_s < all.back().compute_s + all.back().collectives_s) all.back() = equal;
      }
      fastest = std::min(fastest, all.back().compute_s + all.back().collectives_s);
    }
    const SplitPlan* top = nullptr;
    for (const SplitPlan& p : all)
      if (p.compute_s + p.collectives_s <= fastest * 1.02 && (!top || p.micro_batch > top->micro_batch)) top = &p;
    return *top;
  };
  res.equal = best(false);
  res.balanced = best(true);

  // Memory at the balanced plan's micro-batch (the larger of the two when they differ).
  const int b_mem = std::max(res.equal.micro_batch, res.balanced.micro_batch);
  const std::vector<MemoryRow> mem = rank_memory(res.ranks, o, b_mem);
  for (int i = 0; i < W; ++i) {
    PlanRank& r = res.ranks[size_t(i)];
    r.memory = mem[size_t(i)];
    r.fits = r.capacity_bytes <= 0 || r.memory.total() <= r.capacity_bytes;
    if (!r.fits) res.fits = false;
  }

  if (o.lora.enabled() && !res.fits && o.zero_stage < 3)
    res.notes.push_back(strcat("LoRA holds the frozen base whole on every rank (", any_gpu ? "bf16" : "fp32", ", ",
                               std::round(double(o.model.num_parameters()) * (any_gpu ? 2.0 : 4.0) / double(1ull << 30) * 10) / 10,
                               " GiB); --zero 3 shards it across the ranks (1/", W, " each)"));
  if (o.lora.enabled() && any_gpu)
    res.notes.push_back(strcat("LoRA on GPUs: the adapters' optimizer runs on the host (their fp32 master and Adam m, v in "
                               "host memory); its update and the copies of the adapters' gradients down and bf16 copy up "
                               "take ", std::round(opt_s * 1000) / 1000, " s a step; like all of --device cuda, LoRA has "
                               "run on the simulator only so far"));
  if (o.offload_optimizer && any_gpu)
    res.notes.push_back(strcat("--offload-optimizer: each GPU rank's fp32 master weights and Adam m, v (",
                               std::round(12.0 * double(ShardLayout(padded, W).shard) / double(1ull << 30) * 10) / 10,
                               " GiB) live in host memory, which also holds them without offload (checkpoint staging); "
                               "the host's update and its copies take ", std::round(opt_s * 10) / 10,
                               " s per step (host_memory_gbps ", c.host_memory_gbps, " per node, host_copy_gbps ",
                               c.host_copy_gbps, ")"));
  if (o.zero_stage == 3 && any_gpu)
    res.notes.push_back(strcat("ZeRO 3 on GPUs is planned from the CPU's implementation (bf16 blocks gathered, ",
                               o.bf16_grads ? "bf16" : "fp32",
                               " gradient shards, as on cuda-sim); like all of --device cuda it has run on the simulator only so far "
                               "(scripts/gpu-check.sh's zero step checks it against ZeRO 1 on a GPU)"));
  for (SplitPlan* p : {&res.equal, &res.balanced}) {
    p->collectives_s = collectives(*p);
    p->optimizer_s = opt_s;
    p->step_s = p->compute_s + p->collectives_s + opt_s;
    p->epoch_s = p->step_s * double(res.steps_per_epoch);
  }
  if (o.zero_stage == 3 && any_gpu && o.zero3_prefetch > 0) note_without_prefetch(hf, o, c, &res);
  if (!res.fits && any_gpu && o.zero_stage > 0 && !o.offload_optimizer && !o.lora.enabled()) note_with_offload(hf, o, c, &res);
  return res;
}

// GPU ZeRO 3 gathers the next block ahead (one more block's bf16 weights per rank): where that
// memory costs micro-batch size, say what --zero3-prefetch 0 would give (the plan does not model
// the overlap the prefetch buys, so only its memory shows here).
void note_without_prefetch(const Hostfile& hf, const PlanOptions& o, const PlanConstants& c, PlanResult* res) {
  PlanOptions off = o;
  off.zero3_prefetch = 0;
  const PlanResult p = make_plan(hf, off, c);
  const SplitPlan& with = res->balanced.epoch_s < res->equal.epoch_s ? res->balanced : res->equal;
  const SplitPlan& without = p.balanced.epoch_s < p.equal.epoch_s ? p.balanced : p.equal;
  std::string text = "ZeRO 3 on GPUs gathers the next block while the current one computes, which holds one more "
                     "block's bf16 weights per rank (--zero3-prefetch 1, train's default)";
  if (p.fits && (!res->fits || without.micro_batch > with.micro_batch))
    text += strcat("; with --zero3-prefetch 0 micro-batch ", without.micro_batch, " fits and an epoch takes ",
                   plan_duration_text(without.epoch_s), " instead of ",
                   res->fits ? plan_duration_text(with.epoch_s) : std::string("not fitting"),
                   " (the overlap is not modelled)");
  res->notes.push_back(text);
}

std::string plan_duration_text(double s) {
  char buf[64];
  if (s >= 3 * 3600)
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else if (s >= 120)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::vector<std::string> what_would_fit(const Hostfile& hf, const PlanOptions& o, const PlanConstants& c) {
  struct Candidate {
    std::string flags;
    PlanOptions opt;
  };
  std::vector<Candidate> candidates;
  for (Recompute r : {Recompute::kAttn, Recompute::kFull})
    if (int(r) > int(o.recompute)) {
      PlanOptions x = o;
      x.recompute = r;
      candidates.push_back({strcat("--recompute ", recompute_name(r)), x});
    }
  const int top_stage = 3;
  for (int z = o.zero_stage + 1; z <= top_stage; ++z) {
    PlanOptions x = o;
    x.zero_stage = z;
    candidates.push_back({strcat("--zero ", z), x});
  }
  bool any_gpu = false;
  for (const auto& h : hf.hosts) any_gpu = any_gpu || !h.gpu.empty();
  const bool offload = any_gpu && !o.lora.enabled();  // LoRA's adapters are updated on the host anyway
  if (offload && !o.offload_optimizer) {
    PlanOptions x = o;
    x.offload_optimizer = true;
    x.zero_stage = std::max(1, o.zero_stage);
    candidates.push_back({strcat(o.zero_stage < 1 ? "--zero 1 " : "", "--offload-optimizer"), x});
  }
  PlanOptions all = o;  // every saver at once
  all.recompute = Recompute::kFull;
  all.zero_stage = top_stage;
  all.offload_optimizer = offload;
  const std::string all_flags = strcat("--recompute full --zero ", top_stage, offload ? " --offload-optimizer" : "");
  candidates.push_back({all_flags, all});

  std::vector<std::string> out;
  for (const Candidate& k : candidates) {
    const PlanResult p = make_plan(hf, k.opt, c);
    if (!p.fits) continue;
    const SplitPlan& best = p.balanced.epoch_s < p.equal.epoch_s ? p.balanced : p.equal;
    out.push_back(
        strcat(k.flags, ": micro-batch ", best.micro_batch, " fits, an epoch takes ", plan_duration_text(best.epoch_s)));
  }
  // The combination only when no single change fits.
  if (out.size() > 1 && out.back().rfind(all_flags, 0) == 0) out.pop_back();
  return out;
}

// A GPU plan that does not fit: say whether --offload-optimizer (the fp32 master weights and Adam
// state in host memory) would make it fit, and at what epoch time.
void note_with_offload(const Hostfile& hf, const PlanOptions& o, const PlanConstants& c, PlanResult* res) {
  PlanOptions off = o;
  off.offload_optimizer = true;
  const PlanResult p = make_plan(hf, off, c);
  if (!p.fits) return;
  const SplitPlan& best = p.balanced.epoch_s < p.equal.epoch_s ? p.balanced : p.equal;
  res->notes.push_back(strcat("with --offload-optimizer (fp32 master weights and Adam m, v in host memory) micro-batch ",
                              best.micro_batch, " fits and an epoch takes ", plan_duration_text(best.epoch_s)));
}

}  // namespace lt
