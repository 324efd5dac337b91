#include <omp.h>

#include <cstdio>

#include "cli/commands.h"
#include "llamatrain/config.h"
#include "llamatrain/runtime.h"

namespace lt::cli {

CLI::App* setup_info(CLI::App& root, InfoOptions& opt) {
  CLI::App* sub = root.add_subcommand("info", "Print version, build options, devices, threads and BLAS");
  (void)opt;
  return sub;
}

int run_info(const InfoOptions& opt) {
  (void)opt;
  const World& w = world();
  if (w.rank != 0) return 0;
  std::printf("llamatrain %s\n", LLAMATRAIN_VERSION);
  std::printf("build:        %s, %s, C++17\n", LLAMATRAIN_BUILD_TYPE, LLAMATRAIN_CXX_COMPILER);
  std::printf("cuda toolkit: %s at build time (CUDA backend: not built yet)\n",
              LLAMATRAIN_HAVE_CUDA_TOOLKIT ? "found" : "not found");
  std::printf("devices:      cpu (%d hardware threads on %s)\n", hardware_cores(), w.host.c_str());
  std::printf("threads:      %d OpenMP threads per rank%s\n", omp_get_max_threads(),
              std::getenv("OMP_NUM_THREADS") ? " (OMP_NUM_THREADS)" : " (cores / ranks on this node)");
  std::printf("blas:         %s\n", LLAMATRAIN_BLAS_NAME);
  std::printf("mpi:          %s, %d rank(s)\n", w.mpi ? "initialised" : "not launched by mpirun", w.size);
  std::string presets;
  for (const auto& n : preset_names()) presets += (presets.empty() ? "" : " ") + n;
  std::printf("presets:      %s\n", presets.c_str());
  return 0;
}

}  // namespace lt::cli
