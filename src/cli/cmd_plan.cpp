// `llamatrain plan`: memory per rank and predicted step/epoch times for a hostfile, before a job
// is queued; `--calibrate METRICS.jsonl` fits the model's rates from a measured run.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/ranges.h"
#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/plan.h"
#include "llamatrain/runtime.h"

namespace lt::cli {

namespace {

using nlohmann::json;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gib(double bytes) { return fmt("%.2f", bytes / double(1ull << 30)); }

std::string duration(double s) { return plan_duration_text(s); }

void print_table(const std::vector<std::vector<std::string>>& rows, size_t left_cols) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(width[c] - r[c].size(), ' ');
      line += "  " + (c < left_cols ? r[c] + pad : pad + r[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

// Ranks grouped by device kind (GPU type, or cpu at a thread count), in rank order.
struct Group {
  std::string name;
  std::vector<int> ranks;
};
std::vector<Group> groups_of(const PlanResult& p) {
  std::vector<Group> g;
  for (const PlanRank& r : p.ranks) {
    const std::string name = r.gpu ? r.device : strcat("cpu (", r.threads, " thread", r.threads == 1 ? "" : "s", ")");
    auto it = std::find_if(g.begin(), g.end(), [&](const Group& x) { return x.name == name; });
    if (it == g.end()) g.push_back({name, {}}), it = g.end() - 1;
    it->ranks.push_back(r.rank);
  }
  return g;
}

std::string k_range(const std::vector<int>& k, const std::vector<int>& ranks) {
  int lo = 1 << 30, hi = 0;
  for (int r : ranks) lo = std::min(lo, k[size_t(r)]), hi = std::max(hi, k[size_t(r)]);
  return lo == hi ? strcat(lo) : strcat(lo, "-", hi);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// "2 on localhost (OMP_NUM_THREADS); ...": each CPU host's threads per rank and where that count
// came from, as train would run them; empty without CPU ranks.
std::string cpu_threads_text(const PlanResult& p) {
  std::string text;
  const PlanRank* last = nullptr;
  for (const PlanRank& r : p.ranks) {
    if (r.gpu || (last && last->host == r.host)) continue;
    text += strcat(text.empty() ? "" : "; ", r.threads, " on ", r.host, " (", r.threads_source, ")");
    last = &r;
  }
  return text;
}

json split_json(const SplitPlan& s) {
  return {{"micro_batch", s.micro_batch}, {"split", s.k},           {"compute_s", s.compute_s},
          {"collectives_s", s.collectives_s}, {"optimizer_s", s.optimizer_s}, {"step_s", s.step_s},
          {"epoch_s", s.epoch_s}};
}

json constants_json(const PlanConstants& c) { return json::parse(calibration_to_json(c)); }

void print_plan(const PlanOptions& o, const PlanResult& p, const PlanConstants& c, const std::string& hostfile) {
  std::printf("plan: %s (%.1fM parameters), seq %d, global batch %lld, ZeRO %d, %s gradients, recompute %s\n",
              o.model_name.c_str(), double(o.model.num_parameters()) / 1e6, o.seq_len, (long long)o.global_batch,
              o.zero_stage, o.bf16_grads ? "bf16" : "fp32", recompute_name(o.recompute));
  std::printf("      %zu rank(s) from %s; %lld sequences per epoch = %lld steps\n", p.ranks.size(), hostfile.c_str(),
              (long long)o.train_sequences, (long long)p.steps_per_epoch);
  if (o.lora.enabled()) {
    const size_t n = LoraLayout(o.model, o.lora).total();
    std::printf("      LoRA rank %d on %s: %.4gM trained parameters (%.3g%% of the model), the base frozen (in params)\n",
                o.lora.rank, lora_targets_string(o.lora.targets).c_str(), double(n) / 1e6,
                100.0 * double(n) / double(o.model.num_parameters()));
  }
  std::printf("      %.4g GFLOP executed per token (model %.4g)\n", p.flops_per_token / 1e9,
              o.model.flops_per_token(o.seq_len) / 1e9);
  if (const std::string t = cpu_threads_text(p); !t.empty())
    std::printf("      OpenMP threads per cpu rank, as train runs them: %s\n", t.c_str());
  std::printf("constants: %s\n\n", c.source.c_str());
  const auto groups = groups_of(p);

  const int b_mem = std::max(p.equal.micro_batch, p.balanced.micro_batch);
  std::printf("memory per rank (GiB) at micro-batch %d:\n", b_mem);
  std::vector<std::vector<std::string>> rows = {
      {"device", "ranks", "params", "grads", "optimizer", "activations", "blocks", "total", "usable", "fits",
       "max_micro_batch"}};
  for (const Group& g : groups) {
    // The rank of the group that holds the most (the last shard can be shorter).
    const PlanRank* worst = &p.ranks[size_t(g.ranks[0])];
    for (int r : g.ranks)
      if (p.ranks[size_t(r)].memory.total() > worst->memory.total()) worst = &p.ranks[size_t(r)];
    const MemoryRow& m = worst->memory;
    rows.push_back({g.name, strcat(g.ranks.size()), gib(m.params), gib(m.grads), gib(m.optimizer), gib(m.activations),
                    gib(m.gathered), gib(m.total()), worst->capacity_bytes > 0 ? gib(worst->capacity_bytes) : "-",
                    worst->capacity_bytes > 0 ? (worst->fits ? "yes" : "NO") : "n/a",
                    worst->max_micro_batch >= 0 ? strcat(worst->max_micro_batch) : "-"});
  }
  print_table(rows, 1);
  const char* shard_grads = o.bf16_grads && o.zero_stage >= 2 ? "bf16" : "fp32";
  std::printf("  (GPU ranks: bf16 parameters, %s gradients, fp32 master weights + Adam m, v in optimizer%s; CPU ranks: "
              "fp32 except %s gradients, host memory not checked; blocks: ZeRO 2/3's fp32 gradient scratch and "
              "ZeRO 3's gathered weights of one block at a time, on GPUs also the next block's weights with "
              "--zero3-prefetch 1; the GPU totals add 32 MiB of cuBLASLt workspace)\n\n",
              shard_grads, o.offload_optimizer ? " (0: --offload-optimizer keeps them in host memory)" : "", shard_grads);

  std::printf("rate per rank:\n");
  rows = {{"device", "ranks", "GFLOP/s", "source"}};
  for (const Group& g : groups) {
    const PlanRank& r = p.ranks[size_t(g.ranks[0])];
    rows.push_back({g.name, strcat(g.ranks.size()), fmt("%.4g", r.gflops), r.rate_source});
    for (int i : g.ranks)
      if (p.ranks[size_t(i)].gflops != r.gflops)
        rows.push_back({strcat("  rank ", i), "1", fmt("%.4g", p.ranks[size_t(i)].gflops), p.ranks[size_t(i)].rate_source});
  }
  print_table(rows, 1);
  if (p.ranks.size() > 1)
    std::printf("collectives: rings over the slowest link, %s = %.4g GB/s\n", p.ring_link.c_str(), p.ring_gbps);
  std::printf("\n");

  std::printf("predicted step and epoch:\n");
  std::vector<std::string> head = {"batches", "micro_batch"};
  for (const Group& g : groups) head.push_back("k " + g.name);
  for (const char* h : {"compute", "collectives", "optimizer", "step", "epoch"}) head.push_back(h);
  rows = {head};
  for (const auto& [name, s] : {std::make_pair("equal", &p.equal), std::make_pair("balanced", &p.balanced)}) {
    std::vector<std::string> r = {name, strcat(s->micro_batch)};
    for (const Group& g : groups) r.push_back(k_range(s->k, g.ranks));
    for (double v : {s->compute_s, s->collectives_s, s->optimizer_s, s->step_s}) r.push_back(fmt("%.4g s", v));
    r.push_back(duration(s->epoch_s));
    rows.push_back(r);
  }
  print_table(rows, 1);
  std::printf("balanced split (micro-batches of %d per rank): %s; equal: %s\n", p.balanced.micro_batch,
              join(p.balanced.k).c_str(), join(p.equal.k).c_str());
  std::printf("balanced / equal epoch time: %.3f\n", p.balanced.epoch_s / p.equal.epoch_s);
  if (!p.fits) std::printf("DOES NOT FIT: at least one rank lacks the memory (see the table)\n");
  for (const std::string& n : p.notes) std::printf("note: %s\n", n.c_str());
}

json plan_json(const PlanOptions& o, const PlanResult& p, const PlanConstants& c, const std::string& hostfile) {
  json ranks = json::array();
  for (const PlanRank& r : p.ranks)
    ranks.push_back({{"rank", r.rank}, {"host", r.host}, {"device", r.device}, {"threads", r.threads},
                     {"threads_source", r.threads_source}, {"gflops", r.gflops}, {"rate_source", r.rate_source},
                     {"memory", {{"params_bytes", r.memory.params}, {"grads_bytes", r.memory.grads},
                                 {"optimizer_bytes", r.memory.optimizer}, {"activation_bytes", r.memory.activations},
                                 {"gathered_bytes", r.memory.gathered}, {"workspace_bytes", r.memory.workspace},
                                 {"total_bytes", r.memory.total()}, {"usable_bytes", r.capacity_bytes}}},
                     {"fits", r.fits}, {"max_micro_batch", r.max_micro_batch}});
  return {{"model", o.model_name},
          {"n_layers", o.model.n_layers},
          {"n_params", o.model.num_parameters()},
          {"lora_rank", o.lora.rank},
          {"trained_params", o.lora.enabled() ? int64_t(LoraLayout(o.model, o.lora).total()) : o.model.num_parameters()},
          {"seq_len", o.seq_len},
          {"global_batch", o.global_batch},
          {"zero_stage", o.zero_stage},
          {"grad_reduce_dtype", o.bf16_grads ? "bf16" : "fp32"},
          {"recompute", recompute_name(o.recompute)},
          {"hostfile", hostfile},
          {"train_sequences", o.train_sequences},
          {"steps_per_epoch", p.steps_per_epoch},
          {"flops_per_token", p.flops_per_token},
          {"ring_gbps", p.ring_gbps},
          {"ring_link", p.ring_link},
          {"fits", p.fits},
          {"equal", split_json(p.equal)},
          {"balanced", split_json(p.balanced)},
          {"ranks", ranks},
          {"notes", p.notes},
          {"constants", constants_json(c)}};
}

}  // namespace

CLI::App* setup_plan(CLI::App& root, PlanCliOptions& opt) {
  CLI::App* sub = root.add_subcommand(
      "plan", "Predict memory per rank and step/epoch time for a hostfile (equal and balanced batches); "
              "--calibrate fits the model from a measured run's metrics");
  std::string presets;
  for (const auto& n : preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  sub->add_option("--hostfile", opt.hostfile,
                  "Open MPI hostfile with '# gpu=<type> nic_gbps=<n>' annotations (default: this machine as one CPU node)");
  sub->add_option("--model-config", opt.model_config, "Model preset: " + presets)->required();
  // At most 4096, as every model reader (config.json, llama2.c headers): 2^31 layers grew past 3 GB.
  in_range(sub->add_option("--n-layers", opt.n_layers, "Override the preset's number of layers (as train --n-layers)"),
           ints_between(1, 4096));
  in_range(sub->add_option("--seq-len", opt.seq_len, "Tokens per sequence (default: the --data file's)"), ints_from(1));
  in_range(sub->add_option("--global-batch", opt.global_batch, "Sequences per optimizer step over all ranks"),
           ints_from<int64_t>(1));
  in_range(sub->add_option("--batch-size", opt.batch_size, "Sequences per micro-batch (default: the planner picks)"),
           ints_from(1));
  in_range(sub->add_option("--zero", opt.zero_stage,
                           "ZeRO stage 0, 1, 2 or 3 (3 on GPUs is planned from the cuda-sim implementation, which "
                           "has not yet run on a GPU)")
               ->capture_default_str(),
           ints_between(0, 3));
  add_choice(sub, "--grad-reduce-dtype", opt.grad_reduce_dtype, {{"fp32", DType::kF32}, {"bf16", DType::kBF16}},
             "Gradients on the wire (and, ZeRO 2/3, in each rank's shard): fp32 or bf16 (as train's)");
  in_range(sub->add_option("--zero3-prefetch", opt.zero3_prefetch,
                           "GPU ZeRO 3: blocks gathered ahead of use (as train's; 1 holds one more block's bf16 "
                           "weights)")
               ->capture_default_str(),
           ints_between(0, 1));
  sub->add_flag("--offload-optimizer", opt.offload_optimizer,
                "GPU ZeRO 1-3: fp32 master weights and Adam m, v in host memory, the update on the host (as train's)");
  add_choice(sub, "--recompute", opt.recompute,
             {{"none", Recompute::kNone}, {"attn", Recompute::kAttn}, {"full", Recompute::kFull}},
             "Activation recomputation: none, attn or full");
  auto* data = sub->add_option("--data", opt.data, "Dataset made by `llamatrain prepare` (its training sequences)");
  in_range(sub->add_option("--tokens", opt.tokens, "Training tokens per epoch (instead of --data)")->excludes(data),
           ints_from<int64_t>(1));
  in_range(sub->add_option("--np", opt.np, "Ranks (the first N slots of the hostfile; default all)"), ints_from(1));
  // At most a hostfile line's slots (2^20): one rank per core of this machine's node.
  in_range(sub->add_option("--cpu-cores", opt.cpu_cores,
                           "Cores of a CPU node (default: this machine's); a CPU rank runs OMP_NUM_THREADS threads, "
                           "else cores / ranks on the node, as train does"),
           ints_between(1, 1 << 20));
  sub->add_option("--simulate-slowdown", opt.simulate_slowdown,
                  "RANK=FACTOR: that rank computes FACTOR times slower (as train --simulate-slowdown)");
  sub->add_option("--calibration", opt.calibration, "Constants fitted by --calibrate (a JSON file)");
  sub->add_option("--calibrate", opt.calibrate,
                  "Fit rates (and link bandwidth) from train --metrics JSONL files of a run on --hostfile "
                  "(repeatable); with --global-batch and --data/--tokens also plans with the fit");
  sub->add_option("--output", opt.output, "--calibrate: write the fitted constants here (JSON, for --calibration)");
  in_range(sub->add_option("--lora-rank", opt.lora.rank,
                           "Plan LoRA (as train --lora-rank): rank-R adapters trained on a frozen base, no gradient "
                           "or optimizer state of the base, only the adapters reduced; --zero 3 shards the frozen base"),
           ints_between(0, 4096));
  sub->add_option_function<std::string>(
         "--lora-targets", [&opt](const std::string& list) { opt.lora.targets = parse_lora_targets(list); },
         "The products with adapters (as train --lora-targets)")
      ->default_str("wq,wk,wv,wo,w1,w2,w3");
  sub->add_flag("--json", opt.json, "Print JSON instead of tables");
  sub->add_flag("--allow-unfit", opt.allow_unfit,
                "Exit 0 when the job does not fit (the plan is printed either way; without this it exits 1)");
  return sub;
}

int run_plan(const PlanCliOptions& opt) {
  if (world().rank != 0) return 0;  // no collectives: one rank answers
  std::vector<NamedPath> inputs = {{"--hostfile", opt.hostfile}, {"--data", opt.data}, {"--calibration", opt.calibration}};
  for (const std::string& m : opt.calibrate) inputs.push_back({"--calibrate", m});
  refuse_output_over_input({{"--output", opt.output}}, inputs);
  PlanOptions o;
  o.model_name = opt.model_config;
  o.model = preset_config(opt.model_config);
  if (opt.n_layers > 0 && opt.n_layers != o.model.n_layers) {
    o.model.n_layers = opt.n_layers;
    o.model_name = strcat(opt.model_config, " with ", opt.n_layers, " layers");
  }
  o.zero_stage = opt.zero_stage;
  o.lora = opt.lora;
  o.bf16_grads = opt.grad_reduce_dtype == DType::kBF16;
  o.zero3_prefetch = opt.zero3_prefetch;
  o.offload_optimizer = opt.offload_optimizer;
  o.recompute = opt.recompute;
  o.micro_batch = opt.batch_size;
  o.np = opt.np;
  o.cpu_cores = opt.cpu_cores;
  o.cpu_threads = omp_num_threads_env();  // train's threads: OMP_NUM_THREADS, else cores / ranks
  int data_seq_len = 0;
  if (!opt.data.empty()) {
    // Only the shape of /train/tokens (n_seq, seq_len + 1) and the seq_len attribute are needed.
    const h5::File f = h5::File::open_read(opt.data);
    if (!f.exists("/train/tokens")) fail(strcat(opt.data, ": no /train/tokens; expected a dataset made by prepare"));
    const h5::Dims d = f.shape("/train/tokens");
    if (d.size() != 2 || d[1] < 2) fail(strcat(opt.data, ": /train/tokens is not (n_seq, seq_len+1)"));
    data_seq_len = int(d[1] - 1);
    o.train_sequences = int64_t(d[0]);
  }
  o.seq_len = opt.seq_len > 0 ? opt.seq_len : data_seq_len;
  if (data_seq_len > 0 && opt.seq_len > 0 && opt.seq_len != data_seq_len)
    fail(strcat("--seq-len ", opt.seq_len, " but ", opt.data, " holds sequences of ", data_seq_len));
  if (o.seq_len <= 0) fail("--seq-len: required (or --data, whose sequence length is used)");
  if (o.seq_len > o.model.max_seq_len)
    fail(strcat("--seq-len ", o.seq_len, " exceeds the max_seq_len ", o.model.max_seq_len, " of --model-config ",
                opt.model_config, " (train refuses such data)"));
  if (opt.tokens > 0) o.train_sequences = opt.tokens / o.seq_len;
  const int cores = opt.cpu_cores > 0 ? opt.cpu_cores : hardware_cores();
  const Hostfile hf = opt.hostfile.empty() ? local_cpu_hostfile(cores) : read_hostfile(opt.hostfile);
  for (const std::string& note : hf.gpu_notes()) std::fprintf(stderr, "plan: note: %s\n", note.c_str());
  const std::string hf_name = opt.hostfile.empty() ? strcat("this machine (one CPU node, ", cores, " cores)") : opt.hostfile;

  PlanConstants c = opt.calibration.empty() ? default_plan_constants()
                                             : read_calibration(opt.calibration, default_plan_constants());
  const bool want_plan = opt.global_batch > 0 || o.train_sequences > 0;
  if (!opt.calibrate.empty()) {
    // Before reading and fitting the runs: the fitted constants can be written.
    if (!opt.output.empty()) check_writable_dir(std::filesystem::path(opt.output).parent_path().string(), "--output");
    CalibrationInput in;
    in.model = o.model;
    in.model_name = o.model_name;
    in.seq_len = o.seq_len;
    in.recompute = o.recompute;
    in.cpu_cores = opt.cpu_cores;
    in.cpu_threads = o.cpu_threads;
    std::vector<MetricsRun> runs;
    for (const auto& path : opt.calibrate) runs.push_back(read_metrics(path));
    const int max_w = std::max_element(runs.begin(), runs.end(), [](auto& a, auto& b) { return a.world_size < b.world_size; })
                          ->world_size;
    if (!opt.simulate_slowdown.empty()) in.slowdown = parse_slowdown(opt.simulate_slowdown, max_w);
    std::vector<std::string> report;
    c = fit_calibration(runs, hf, in, c, &report);
    if (!opt.output.empty()) write_file_atomic(opt.output, calibration_to_json(c));
    if (!opt.json) {
      std::printf("%s on %s, %s, seq %d:\n", c.source.c_str(), hf_name.c_str(), o.model_name.c_str(),
                  o.seq_len);
      for (const auto& line : report) std::printf("  %s\n", line.c_str());
      std::printf("%s", calibration_to_json(c).c_str());
      if (!opt.output.empty()) std::printf("wrote %s (use with --calibration)\n", opt.output.c_str());
    } else if (!want_plan) {
      std::printf("%s", calibration_to_json(c).c_str());
    }
    if (!want_plan) return 0;
    if (!opt.json) std::printf("\n");
  }
  if (opt.global_batch <= 0) fail("--global-batch: required (sequences per optimizer step)");
  if (o.train_sequences <= 0) fail("--data or --tokens: required (the size of an epoch)");
  o.global_batch = opt.global_batch;
  // The slowdown of a plan is a rank of the planned world.
  if (!opt.simulate_slowdown.empty()) {
    const int W = opt.np > 0 ? opt.np : hf.total_slots();
    o.slowdown = parse_slowdown(opt.simulate_slowdown, W);
  }
  const PlanResult p = make_plan(hf, o, c);
  const std::vector<std::string> fixes = p.fits ? std::vector<std::string>{} : what_would_fit(hf, o, c);
  if (opt.json) {
    json j = plan_json(o, p, c, hf_name);
    if (!p.fits) j["would_fit"] = fixes;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_plan(o, p, c, hf_name);
    if (!p.fits) {
      std::printf("what would fit:%s\n", fixes.empty() ? " nothing of --recompute, --zero and --offload-optimizer; "
                                                         "more ranks, a smaller model or a shorter --seq-len" : "");
      for (const std::string& f : fixes) std::printf("  %s\n", f.c_str());
    }
  }
  // A job that fits no rank is an error for scripts (exit 1), unless asked to plan it anyway.
  if (!p.fits && !opt.allow_unfit)
    fail("the job does not fit: at least one rank lacks the memory (the table above; 'what would fit' lists the "
         "changes that do); --allow-unfit exits 0");
  return 0;
}

}  // namespace lt::cli
