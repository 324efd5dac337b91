#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "llamatrain/config.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/hostfile.h"
#include "llamatrain/runtime.h"

namespace lt::cli {

namespace {

// Prints rows as columns padded to their widest cell; columns flagged in `left` are
// left-aligned (names), the others right-aligned (numbers).
void print_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& left) {
  std::vector<size_t> width(left.size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(width[c] - r[c].size(), ' ');
      line += "  " + (left[c] ? r[c] + pad : pad + r[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

std::string number(double v) { return strcat(v); }

// The inventory of a hostfile: one row per host with the peak figures of its GPU type (the
// parser refuses unknown types and stores the table's name), then totals.
void print_hostfile(const Hostfile& hf) {
  std::printf("hostfile:     %s\n", hf.path.c_str());
  std::vector<std::vector<std::string>> rows = {
      {"host", "slots", "max_slots", "gpu", "gpus", "nic_Gb/s", "threads", "bf16_TFLOP/s", "mem_GB/s"}};
  std::vector<std::pair<std::string, int>> gpus_by_type;  // in order of first appearance
  int total_gpus = 0;
  double peak_tflops = 0;
  for (const auto& h : hf.hosts) {
    const GpuSpec* spec = h.gpu.empty() ? nullptr : find_gpu_spec(h.gpu);
    rows.push_back({h.host, number(h.slots), h.max_slots ? number(h.max_slots) : "-", h.gpu.empty() ? "-" : h.gpu,
                    h.gpus ? number(h.gpus) : "-", h.nic_gbps > 0 ? number(h.nic_gbps) : "-",
                    h.threads ? number(h.threads) : "-", spec ? number(spec->bf16_tflops) : "-",
                    spec ? number(spec->hbm_gbps) : "-"});
    if (h.gpu.empty()) continue;
    total_gpus += h.gpus;
    if (spec) peak_tflops += h.gpus * spec->bf16_tflops;
    auto it = gpus_by_type.begin();
    while (it != gpus_by_type.end() && it->first != h.gpu) ++it;
    if (it == gpus_by_type.end())
      gpus_by_type.emplace_back(h.gpu, h.gpus);
    else
      it->second += h.gpus;
  }
  print_table(rows, {true, false, false, true, false, false, false, false, false});
  std::string by_type;
  for (const auto& [type, n] : gpus_by_type) by_type += strcat(by_type.empty() ? " (" : ", ", n, " ", type);
  if (!by_type.empty()) by_type += ")";
  std::printf("totals:       %zu host(s), %d slot(s), %d GPU(s)%s\n", hf.hosts.size(), hf.total_slots(), total_gpus,
              by_type.c_str());
  if (peak_tflops > 0) std::printf("peak bf16:    %s TFLOP/s dense (GPUs with a known spec)\n", number(peak_tflops).c_str());
}

// "cpu; cuda (GPU, sm_80 sm_90); cuda-sim (...)": the device backends linked into this executable.
std::string backends_line(const BuildInfo& b) {
  std::string archs;
  std::istringstream in(b.cuda_archs);
  for (std::string a; in >> a;) archs += " sm_" + a.substr(0, a.find('-'));  // "90-real" -> sm_90
  std::string line = "cpu";
  line += b.cuda_gpu ? strcat("; cuda (GPU, built for", archs.empty() ? " the default architectures" : archs, ")")
                     : std::string("; cuda: not built (no CUDA toolkit at build time)");
  line += b.cuda_sim ? "; cuda-sim (the CUDA kernels on the CPU simulator)" : "; cuda-sim: not built";
  return line;
}

}  // namespace

CLI::App* setup_info(CLI::App& root, InfoOptions& opt) {
  CLI::App* sub = root.add_subcommand("info", "Print version, build options, devices, threads and BLAS (and a hostfile's inventory)");
  sub->add_option("--hostfile", opt.hostfile,
                  "Check an Open MPI hostfile (with the '# gpu=... nic_gbps=...' annotation) and print its inventory");
  return sub;
}

int run_info(const InfoOptions& opt) {
  // Every rank reads the hostfile so that a malformed one fails every rank alike (main reports
  // it once, from rank 0); only rank 0 prints.
  Hostfile hf;
  if (!opt.hostfile.empty()) hf = read_hostfile(opt.hostfile);
  const World& w = world();
  if (w.rank != 0) return 0;
  std::printf("llamatrain %s\n", LLAMATRAIN_VERSION);
  std::printf("build:        %s, %s, C++17\n", LLAMATRAIN_BUILD_TYPE, LLAMATRAIN_CXX_COMPILER);
  std::printf("cuda toolkit: %s at build time\n", LLAMATRAIN_HAVE_CUDA_TOOLKIT ? "found" : "not found");
  std::printf("backends:     %s\n", backends_line(opt.build).c_str());
  std::printf("devices:      cpu (%d hardware threads on %s)\n", hardware_cores(), w.host.c_str());
  std::fputs(device_backends_report().c_str(), stdout);
  std::printf("threads:      %d OpenMP threads per rank%s\n", omp_get_max_threads(),
              std::getenv("OMP_NUM_THREADS") ? " (OMP_NUM_THREADS)" : " (cores / ranks on this node)");
  std::printf("blas:         %s\n", LLAMATRAIN_BLAS_NAME);
  std::printf("cpu bf16:     %s\n", cpu_bf16_report().c_str());
  std::printf("mpi:          %s, %d rank(s)\n", w.mpi ? "initialised" : "not launched by mpirun", w.size);
  std::string presets;
  for (const auto& n : preset_names()) presets += (presets.empty() ? "" : " ") + n;
  std::printf("presets:      %s\n", presets.c_str());
  if (!opt.hostfile.empty()) print_hostfile(hf);
  for (const std::string& note : hf.gpu_notes()) std::printf("note: %s\n", note.c_str());
  return 0;
}

}  // namespace lt::cli
