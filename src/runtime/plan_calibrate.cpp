// Calibrating the planner from a measured run: reading train --metrics files, fitting rates and
// link bandwidth, and the calibration file that carries them (see plan.h).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/json_read.h"
#include "llamatrain/plan.h"

namespace lt {

namespace {

using nlohmann::json;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A field of a metrics record, checked: "<path>:<line>: <type> record: field 'x' ...".
const json& field(const json& j, const char* name, const std::string& at) {
  const auto it = j.find(name);
  if (it == j.end()) fail(strcat(at, "no field '", name, "'"));
  return *it;
}
double number_field(const json& j, const char* name, const std::string& at) {
  const json& v = field(j, name, at);
  if (!v.is_number()) fail(strcat(at, "field '", name, "' is ", v.dump(), ", expected a number"));
  return v.get<double>();
}
template <class T>
std::vector<T> array_field(const json& j, const char* name, const std::string& at, size_t n) {
  const json& v = field(j, name, at);
  if (!v.is_array() || v.size() != n || !std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number(); }))
    fail(strcat(at, "field '", name, "' is ", v.dump(), ", expected an array of ", n, " numbers (one per rank)"));
  return v.get<std::vector<T>>();
}

// The collectives of a step as the trainer runs them: bytes in `elem` bytes per element.
// Stage 1 all-reduces the gradients and all-gathers the weights on GPUs; on CPUs it
// reduce-scatters them as stage 2 does (zero.h).
double ring_volume_factor(int W, int stage, bool gpu) {
  // Bytes sent per rank in units of S / bw: all-reduce 2 (W-1)/W, reduce-scatter or all-gather (W-1)/W.
  const double one = double(W - 1) / W;
  return stage == 1 && gpu ? 3 * one : 2 * one;
}
double ring_steps(int W, int stage, bool gpu) { return stage == 1 && gpu ? 3.0 * (W - 1) : 2.0 * (W - 1); }

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += strcat(i ? "," : "", v[i]);
  return s;
}

// Each rank's OpenMP threads from a "devices" record (files written before they were recorded have
// none). A resumed run appends a record of its own, which must give the same threads.
void read_run_threads(const json& j, const std::string& at, MetricsRun* run) {
  const json& ranks = field(j, "ranks", at);
  if (!ranks.is_array())
    fail(strcat(at, "field 'ranks' is ", ranks.dump(), ", expected an array (one object per rank)"));
  std::vector<int> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].is_object() || !ranks[r].contains("threads")) return;
    const json& t = ranks[r]["threads"];
    if (!t.is_number_integer() || t.get<int64_t>() < 1 || t.get<int64_t>() > (1 << 20))
      fail(strcat(at, "ranks[", r, "].threads is ", t.dump(), ", expected a positive integer"));
    threads.push_back(t.get<int>());
  }
  if (!run->threads.empty() && threads != run->threads)
    fail(strcat(at, "threads per rank [", join_ints(threads), "] differ from the run's first start [",
                join_ints(run->threads), "]; calibrate from runs of one layout"));
  run->threads = threads;
}

}  // namespace

MetricsRun read_metrics(const std::string& path) {
  refuse_special_file(path, "metrics file");
  std::ifstream in(path);
  if (!in) fail(strcat(path, ": cannot open (expected a train --metrics JSONL file)"));
  MetricsRun run;
  run.path = path;
  bool have_memory = false;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at0 = strcat(path, ":", line_no, ": ");
    json j;
    check_json_depth(line, path, line_no);
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      fail(strcat(at0, "not a JSON object (", e.what(), ")"));
    }
    if (!j.is_object()) fail(strcat(at0, "not a JSON object"));
    const json& type = field(j, "type", at0);
    if (!type.is_string()) fail(strcat(at0, "field 'type' is ", type.dump(), ", expected a string"));
    const std::string t = type.get<std::string>();
    const std::string at = strcat(at0, t, " record: ");
    if (t == "memory") {
      // A resumed run appends; every memory record must describe the same job.
      const int W = int(number_field(j, "world_size", at)), Z = int(number_field(j, "zero_stage", at));
      const int64_t n = int64_t(number_field(j, "n_params", at));
      if (W < 1) fail(strcat(at, "field 'world_size' is ", W, ", expected >= 1"));
      if (have_memory && (W != run.world_size || Z != run.zero_stage || n != run.n_params))
        fail(strcat(at, "a second job (world_size ", W, ", zero_stage ", Z, ") in the same file; calibrate from one job"));
      run.world_size = W, run.zero_stage = Z, run.n_params = n;
      have_memory = true;
    } else if (t == "step") {
      if (!have_memory) fail(strcat(at, "comes before the memory record (is the file the start of a run?)"));
      MetricsStep s;
      s.step = int64_t(number_field(j, "step", at));
      s.tokens = int64_t(number_field(j, "tokens", at));
      s.step_ms = number_field(j, "step_ms", at);
      if (!(s.step_ms > 0) || s.tokens <= 0) fail(strcat(at, "step_ms and tokens must be > 0"));
      if (run.world_size > 1) {
        const size_t W = size_t(run.world_size);
        s.split = array_field<int>(j, "split", at, W);
        s.rank_compute_ms = array_field<double>(j, "rank_compute_ms", at, W);
        s.rank_wait_ms = array_field<double>(j, "rank_wait_ms", at, W);
      }
      run.steps.push_back(std::move(s));
    } else if (t == "epoch") {
      run.epoch_time_s.push_back(number_field(j, "epoch_time_s", at));
    } else if (t == "devices") {
      read_run_threads(j, at, &run);
    }
  }
  if (!have_memory) fail(strcat(path, ": no {\"type\":\"memory\"} record; expected the metrics of a train run"));
  if (!run.threads.empty() && int(run.threads.size()) != run.world_size)
    fail(strcat(path, ": the devices record lists the threads of ", run.threads.size(), " rank(s) but world_size is ",
                run.world_size));
  if (run.steps.size() < 2)
    fail(strcat(path, ": ", run.steps.size(), " step record(s); calibration needs at least 2 (the first is skipped)"));
  return run;
}

namespace {

// Step-to-step variation of the ranks' compute (per_step: each rank's compute ms of the steps
// where every rank ran), as the planner models it: each rank's coefficient of variation, and the
// correlation between rank pairs (nothing with one rank or under 3 steps).
void step_variation(const std::vector<std::vector<double>>& per_step, std::vector<double>* cvs,
                    std::vector<double>* rhos) {
  const size_t W = per_step.size();
  if (W < 2 || !std::all_of(per_step.begin(), per_step.end(), [&](auto& v) { return v.size() == per_step[0].size(); }) ||
      per_step[0].size() < 3)
    return;
  const size_t n = per_step[0].size();
  std::vector<double> mu(W, 0), sd(W, 0);
  for (size_t r = 0; r < W; ++r) {
    for (double x : per_step[r]) mu[r] += x / double(n);
    for (double x : per_step[r]) sd[r] += (x - mu[r]) * (x - mu[r]) / double(n);
    sd[r] = std::sqrt(sd[r]);
    if (mu[r] > 0) cvs->push_back(sd[r] / mu[r]);
  }
  for (size_t a = 0; a < W; ++a)
    for (size_t b = a + 1; b < W; ++b) {
      if (sd[a] <= 0 || sd[b] <= 0) continue;
      double cov = 0;
      for (size_t s = 0; s < n; ++s) cov += (per_step[a][s] - mu[a]) * (per_step[b][s] - mu[b]) / double(n);
      rhos->push_back(cov / (sd[a] * sd[b]));
    }
}

}  // namespace

PlanConstants fit_calibration(const std::vector<MetricsRun>& runs, const Hostfile& hf, const CalibrationInput& in,
                              const PlanConstants& base, std::vector<std::string>* report) {
  PlanConstants c = base;
  in.model.validate();
  const double F = executed_flops_per_token(in.model, in.seq_len, in.recompute);
  // Per device kind: the medians of its ranks; samples and sources.
  struct Kind {
    std::vector<double> rank_rates;
    int64_t samples = 0;
    std::string source;
  };
  std::map<std::pair<std::string, int>, Kind> kinds;
  std::vector<double> cpu_links, gpu_link_eff, cvs, rhos;
  for (const MetricsRun& run : runs) {
    if (run.n_params != in.model.num_parameters())
      fail(strcat(run.path, ": the run trained ", run.n_params, " parameters but --model-config ", in.model_name,
                  " has ", in.model.num_parameters(), "; give the run's model"));
    const int W = run.world_size;
    PlanOptions po;
    po.model = in.model;
    po.seq_len = in.seq_len;
    po.global_batch = run.steps[0].tokens / in.seq_len;
    po.np = W;
    po.cpu_cores = in.cpu_cores;
    po.cpu_threads = in.cpu_threads;
    po.train_sequences = po.global_batch;
    po.zero_stage = run.zero_stage;
    if (po.global_batch * in.seq_len != run.steps[0].tokens)
      fail(strcat(run.path, ": steps of ", run.steps[0].tokens, " tokens are not whole sequences of --seq-len ",
                  in.seq_len, "; give the run's sequence length"));
    // Placement, and the link the run's collectives crossed, as the planner sees them.
    const PlanResult layout = make_plan(hf, po, default_plan_constants());
    // Per rank, FLOPs and compute seconds summed over the steps: an epoch is a sum of step times,
    // so the rate that predicts it is total work / total time (a median would drop the slow
    // spells an epoch pays for).
    std::vector<double> flops(static_cast<size_t>(W), 0.0), seconds(static_cast<size_t>(W), 0.0);
    std::vector<int64_t> counted(static_cast<size_t>(W), 0);
    double overhead_s = 0;
    int64_t overhead_n = 0;
    std::vector<std::vector<double>> per_step(static_cast<size_t>(W));  // compute seconds of the steps
    for (size_t s = 1; s < run.steps.size(); ++s) {  // the first step: allocation, cold caches
      const MetricsStep& st = run.steps[s];
      if (W == 1) {
        flops[0] += double(st.tokens) * F;
        seconds[0] += st.step_ms * 1e-3;
        ++counted[0];
        continue;
      }
      const int M = std::accumulate(st.split.begin(), st.split.end(), 0);
      double slowest = 0;
      for (int r = 0; r < W; ++r) {
        const double ms = st.rank_compute_ms[size_t(r)];
        slowest = std::max(slowest, ms);
        if (st.split[size_t(r)] <= 0 || ms <= 0) continue;
        // A simulated slowdown is undone: the rank's device runs `factor` times faster.
        flops[size_t(r)] += double(st.tokens) * st.split[size_t(r)] / M * F;
        seconds[size_t(r)] += ms * 1e-3 / (r == in.slowdown.rank ? in.slowdown.factor : 1.0);
        ++counted[size_t(r)];
        per_step[size_t(r)].push_back(ms);
      }
      overhead_s += std::max(0.0, st.step_ms - slowest) * 1e-3;
      ++overhead_n;
    }
    for (int r = 0; r < W; ++r) {
      if (counted[size_t(r)] == 0 || seconds[size_t(r)] <= 0) continue;
      const PlanRank& pr = layout.ranks[size_t(r)];
      // A CPU rate belongs to the threads the run used: recorded, else as the planner lays them out.
      const bool recorded = !run.threads.empty();
      const int threads = pr.gpu ? 0 : recorded ? run.threads[size_t(r)] : pr.threads;
      Kind& k = kinds[{pr.device, threads}];
      const double rate = flops[size_t(r)] / seconds[size_t(r)] / 1e9;
      k.rank_rates.push_back(rate);
      k.samples += counted[size_t(r)];
      if (k.source.find(run.path) == std::string::npos) k.source += (k.source.empty() ? "" : ", ") + run.path;
      const std::string how =
          recorded ? "as the run recorded" : strcat("assumed (", pr.threads_source, "): the run records none");
      const std::string label = pr.gpu ? "" : strcat(", ", threads, " thread(s) ", how);
      report->push_back(strcat(run.path, ": rank ", r, " (", pr.device, label, "): ", rate, " GFLOP/s over ",
                               counted[size_t(r)], " steps"));
    }
    step_variation(per_step, &cvs, &rhos);
    if (W > 1 && overhead_n > 0) {
      const bool gpu = std::any_of(layout.ranks.begin(), layout.ranks.end(), [](const PlanRank& r) { return r.gpu; });
      const double bytes = (gpu ? 2.0 : 4.0) * double(ShardLayout(size_t(run.n_params), W).padded);
      const double mean_overhead = overhead_s / double(overhead_n);
      const double t = mean_overhead - ring_steps(W, run.zero_stage, gpu) * base.link_latency_s;
      if (t <= 0) {
        report->push_back(strcat(run.path, ": non-compute time per step too small to fit a link bandwidth"));
        continue;
      }
      const double gbps = ring_volume_factor(W, run.zero_stage, gpu) * bytes / t / 1e9;
      report->push_back(strcat(run.path, ": non-compute time per step ", mean_overhead * 1e3, " ms (mean) = ",
                               "ring collectives of ", bytes / 1e6, " MB at ", gbps, " GB/s"));
      if (!gpu) cpu_links.push_back(gbps);
      else if (layout.ring_gbps > 0) gpu_link_eff.push_back(gbps / layout.ring_gbps * base.link_efficiency);
    }
  }
  for (const auto& [key, k] : kinds) {
    CalibratedRate cr;
    cr.device = key.first;
    cr.threads = key.second;
    cr.gflops = median_of(k.rank_rates);
    cr.samples = k.samples;
    cr.source = k.source;
    const double lo = *std::min_element(k.rank_rates.begin(), k.rank_rates.end());
    const double hi = *std::max_element(k.rank_rates.begin(), k.rank_rates.end());
    if (hi > 1.3 * lo)
      report->push_back(strcat("warning: ranks of ", cr.device, " differ by ", hi / lo,
                               "x (a simulated slowdown not given to --simulate-slowdown, or a busy machine)"));
    // The fitted rate replaces an earlier one of the same kind.
    c.rates.erase(std::remove_if(c.rates.begin(), c.rates.end(),
                                 [&](const CalibratedRate& r) { return r.device == cr.device && r.threads == cr.threads; }),
                  c.rates.end());
    c.rates.push_back(cr);
    const GpuSpec* spec = find_gpu_spec(cr.device);
    if (spec) {
      c.gpu_efficiency = cr.gflops / (spec->bf16_tflops * 1e3);
      report->push_back(strcat("fitted ", cr.device, ": ", cr.gflops, " GFLOP/s per rank = efficiency ",
                               c.gpu_efficiency, " of the ", spec->bf16_tflops, " TFLOP/s peak"));
    } else {
      report->push_back(strcat("fitted ", cr.device, " at ", cr.threads, " thread(s): ", cr.gflops,
                               " GFLOP/s per rank (", cr.gflops / cr.threads, " per thread)"));
    }
  }
  if (!cpu_links.empty()) {
    c.cpu_link_gbps = median_of(cpu_links);
    report->push_back(strcat("fitted cpu_link_gbps: ", c.cpu_link_gbps, " GB/s"));
  }
  if (!cvs.empty()) {
    double sq = 0;
    for (double v : cvs) sq += v * v;
    c.compute_cv = std::sqrt(sq / double(cvs.size()));
    report->push_back(strcat("fitted compute_cv: ", c.compute_cv, " (step-to-step variation of a rank's compute time)"));
  }
  if (!rhos.empty()) {
    double sum = 0;
    for (double v : rhos) sum += v;
    c.compute_correlation = std::clamp(sum / double(rhos.size()), -1.0, 1.0);
    report->push_back(strcat("fitted compute_correlation: ", c.compute_correlation, " (between ranks)"));
  }
  if (!gpu_link_eff.empty()) {
    c.link_efficiency = median_of(gpu_link_eff);
    report->push_back(strcat("fitted link_efficiency: ", c.link_efficiency));
  }
  std::string src;
  for (const MetricsRun& r : runs) src += (src.empty() ? "" : ", ") + r.path;
  c.source = "calibrated from " + src;
  return c;
}

namespace {

// The numeric constants by name, for the calibration file.
std::vector<std::pair<const char*, double PlanConstants::*>> constant_fields() {
  return {{"gpu_efficiency", &PlanConstants::gpu_efficiency},
          {"gpu_memory_usable", &PlanConstants::gpu_memory_usable},
          {"hbm_efficiency", &PlanConstants::hbm_efficiency},
          {"adamw_bytes_per_param", &PlanConstants::adamw_bytes_per_param},
          {"cpu_gflops_per_thread", &PlanConstants::cpu_gflops_per_thread},
          {"cpu_link_gbps", &PlanConstants::cpu_link_gbps},
          {"link_efficiency", &PlanConstants::link_efficiency},
          {"link_latency_s", &PlanConstants::link_latency_s},
          {"compute_cv", &PlanConstants::compute_cv},
          {"compute_correlation", &PlanConstants::compute_correlation},
          {"host_memory_gbps", &PlanConstants::host_memory_gbps},
          {"host_copy_gbps", &PlanConstants::host_copy_gbps}};
}

}  // namespace

std::string calibration_to_json(const PlanConstants& c) {
  json consts = json::object();
  for (const auto& [name, member] : constant_fields()) consts[name] = c.*member;
  json rates = json::array();
  for (const auto& r : c.rates)
    rates.push_back({{"device", r.device}, {"threads", r.threads}, {"gflops", r.gflops}, {"samples", r.samples},
                     {"source", r.source}});
  json j = {{"format", "llamatrain-plan-calibration"}, {"format_version", 1}, {"source", c.source},
            {"constants", consts}, {"rates", rates}};
  return j.dump(2) + "\n";
}

PlanConstants read_calibration(const std::string& path, const PlanConstants& base) {
  const std::string text = read_file_bytes(path);
  json j;
  check_json_depth(text, path);
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(strcat(path, ": not JSON (", e.what(), ")"));
  }
  if (!j.is_object() || j.value("format", "") != "llamatrain-plan-calibration")
    fail(strcat(path, ": expected a calibration file written by `plan --calibrate` (format \"llamatrain-plan-calibration\")"));
  if (j.value("format_version", 0) != 1) fail(strcat(path, ": format_version ", j.value("format_version", 0), ", expected 1"));
  PlanConstants c = base;
  c.source = path;
  c.rates.clear();
  if (j.contains("constants")) {
    const json& k = j["constants"];
    if (!k.is_object()) fail(strcat(path, ": constants: expected an object of name: number"));
    for (const auto& [name, v] : k.items()) {
      double PlanConstants::*member = nullptr;
      std::string known;
      for (const auto& [n, m] : constant_fields()) {
        if (name == n) member = m;
        known += (known.empty() ? "" : ", ") + std::string(n);
      }
      if (!member) fail(strcat(path, ": constants.", name, ": unknown constant; expected one of ", known));
      const bool signed_ok = name == "compute_correlation", zero_ok = signed_ok || name == "compute_cv";
      if (!v.is_number() || (signed_ok ? std::abs(v.get<double>()) > 1
                                       : zero_ok ? v.get<double>() < 0 : !(v.get<double>() > 0)))
        fail(strcat(path, ": constants.", name, ": ", v.dump(), ", expected ",
                    signed_ok ? "a number in [-1, 1]" : zero_ok ? "a number >= 0" : "a positive number"));
      c.*member = v.get<double>();
    }
  }
  if (j.contains("rates")) {
    const json& rs = j["rates"];
    if (!rs.is_array()) fail(strcat(path, ": rates: expected an array"));
    for (size_t i = 0; i < rs.size(); ++i) {
      const json& r = rs[i];
      const std::string at = strcat(path, ": rates[", i, "]");
      if (!r.is_object() || !r.contains("device") || !r["device"].is_string())
        fail(strcat(at, ".device: expected a GPU type or \"cpu\""));
      if (!r.contains("gflops") || !r["gflops"].is_number() || !(r["gflops"].get<double>() > 0))
        fail(strcat(at, ".gflops: expected a positive number"));
      CalibratedRate cr;
      cr.device = r["device"].get<std::string>();
      if (cr.device != "cpu") cr.device = require_gpu_spec(cr.device, strcat(at, ".device")).name;
      if (cr.device == "cpu" && (!r.contains("threads") || !r["threads"].is_number_integer() || r["threads"].get<int>() < 1))
        fail(strcat(at, ".threads: expected a positive integer for a cpu rate"));
      cr.threads = r.value("threads", 0);
      cr.gflops = r["gflops"].get<double>();
      cr.samples = r.value("samples", int64_t(0));
      cr.source = r.value("source", path);
      c.rates.push_back(cr);
    }
  }
  return c;
}

}  // namespace lt
