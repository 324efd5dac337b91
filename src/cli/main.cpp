// llamatrain: one binary, CLI11 subcommands. MPI is initialised when a launcher started us and
// finalized on every path; only rank 0 prints help and parse errors.
#include <omp.h>

#include <cstdio>
#include <functional>
#include <vector>

#include "cli/commands.h"
#include "llamatrain/error.h"
#include "llamatrain/runtime.h"

// The CUDA backend builds linked into this executable (src/backend/cuda/register.cu).
#if LLAMATRAIN_WITH_CUDA_SIM
extern "C" void llamatrain_register_simulated_backend();
#endif
#if LLAMATRAIN_WITH_CUDA_GPU
extern "C" void llamatrain_register_gpu_backend();
#endif

int main(int argc, char** argv) {
  lt::MpiSession mpi(&argc, &argv);
  const bool rank0 = lt::world().rank == 0;
  omp_set_num_threads(lt::default_threads());
#if LLAMATRAIN_WITH_CUDA_SIM
  llamatrain_register_simulated_backend();
#endif
#if LLAMATRAIN_WITH_CUDA_GPU
  llamatrain_register_gpu_backend();
#endif

  CLI::App app{"llamatrain: pre-train and fine-tune Llama 2 models on CPUs and GPUs, launched by mpirun"};
  app.set_version_flag("--version", std::string("llamatrain ") + LLAMATRAIN_VERSION);
  app.set_config("--config", "", "Read options from a TOML/INI file ([train] sections per subcommand)");
  app.require_subcommand(1);
  app.fallthrough();

  lt::cli::InfoOptions info;
  lt::cli::PrepareOptions prepare;
  lt::cli::TrainCliOptions train;
  lt::cli::EvalOptions eval;
  lt::cli::GenerateOptions generate;
  lt::cli::ConvertOptions convert;
  lt::cli::PlanCliOptions plan;
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands = {
      {lt::cli::setup_info(app, info), [&] { return lt::cli::run_info(info); }},
      {lt::cli::setup_prepare(app, prepare), [&] { return lt::cli::run_prepare(prepare); }},
      {lt::cli::setup_train(app, train), [&] { return lt::cli::run_train(train); }},
      {lt::cli::setup_eval(app, eval), [&] { return lt::cli::run_eval(eval); }},
      {lt::cli::setup_generate(app, generate), [&] { return lt::cli::run_generate(generate); }},
      {lt::cli::setup_convert(app, convert), [&] { return lt::cli::run_convert(convert); }},
      {lt::cli::setup_plan(app, plan), [&] { return lt::cli::run_plan(plan); }},
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same arguments, so every rank sees the same error; rank 0 reports.
    if (rank0) return app.exit(e);
    return e.get_exit_code();
  }

  for (auto& [sub, run] : commands) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const lt::CollectiveError& e) {
      // Every rank holds the same error: one report, and every rank exits (and finalizes) cleanly.
      std::fflush(stdout);
      if (rank0) std::fprintf(stderr, "llamatrain %s: error: %s\n", sub->get_name().c_str(), e.what());
      return 1;
    } catch (const lt::Error& e) {
      std::fflush(stdout);
      // One rank's own failure inside `train`: its peers may be waiting in a collective, so the
      // job is taken down with the rank named. The other commands run no collectives: every rank
      // does the same work and meets the same error, which rank 0 reports.
      if (lt::world().size > 1 && sub->get_name() == "train")
        mpi.abort(lt::strcat("llamatrain ", sub->get_name(), ": error: ", e.what()));
      if (rank0) std::fprintf(stderr, "llamatrain %s: error: %s\n", sub->get_name().c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fflush(stdout);
      mpi.abort(lt::strcat("llamatrain ", sub->get_name(), ": unexpected error: ", e.what()));
    }
  }
  return 0;
}
