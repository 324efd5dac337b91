// llamatrain: one binary, CLI11 subcommands. MPI is initialised when a launcher started us and
// finalized on every path; only rank 0 prints help and parse errors.
#include <omp.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <vector>

#include "cli/arguments.h"
#include "cli/commands.h"
#include "cli/config_file.h"
#include "llamatrain/comm_wait.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/runtime.h"

// The CUDA backend builds linked into this executable (src/backend/cuda/register.cu).
#ifndef LLAMATRAIN_WITH_CUDA_SIM
#define LLAMATRAIN_WITH_CUDA_SIM 0
#endif
#ifndef LLAMATRAIN_WITH_CUDA_GPU
#define LLAMATRAIN_WITH_CUDA_GPU 0
#endif
#ifndef LLAMATRAIN_CUDA_ARCHS
#define LLAMATRAIN_CUDA_ARCHS ""
#endif
#if LLAMATRAIN_WITH_CUDA_SIM
extern "C" void llamatrain_register_simulated_backend();
#endif
#if LLAMATRAIN_WITH_CUDA_GPU
extern "C" void llamatrain_register_gpu_backend();
#endif

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) the kernel sends SIGXFSZ, which kills without a message and
  // leaves temporaries behind. Ignored, the write fails with EFBIG instead and takes the writers'
  // ENOSPC path: an error naming the file, temporaries removed, exit status 1 (train: 4).
  std::signal(SIGXFSZ, SIG_IGN);
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
  app.set_config("--config", "",
                 "Read options from a TOML file, one [section] per command (e.g. [train] with max-steps = 100); "
                 "the command line wins over the file");
  app.config_formatter(std::make_shared<lt::cli::ConfigReader>());
  app.require_subcommand(1);
  app.fallthrough();

  lt::cli::InfoOptions info;
  info.build.cuda_sim = LLAMATRAIN_WITH_CUDA_SIM;
  info.build.cuda_gpu = LLAMATRAIN_WITH_CUDA_GPU;
  info.build.cuda_archs = LLAMATRAIN_CUDA_ARCHS;
  lt::cli::PrepareOptions prepare;
  lt::cli::TrainCliOptions train;
  train.train.command_line = lt::cli::command_line_text(argc, argv);
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

  // Every rank parses the same arguments and reads the same config file, so every rank sees the
  // same error; rank 0 reports it. The whole config file is checked before CLI11 applies it, so
  // that its errors name the line.
  const std::string word = lt::cli::command_word(argc, argv);
  CLI::App* sub = nullptr;
  for (auto& command : commands)
    if (command.first->get_name() == word) sub = command.first;
  const std::string who = sub ? "llamatrain " + word : std::string("llamatrain");
  auto report = [&](const std::string& what) {
    if (rank0) std::fprintf(stderr, "%s: error: %s\n", who.c_str(), what.c_str());
    return 1;
  };
  try {
    lt::cli::check_command_word(word, app);
    const std::string config = lt::cli::config_path_in_args(argc, argv);
    if (!config.empty()) {
      lt::cli::check_config(lt::cli::read_config_file(config), app);
      lt::note_input({"--config", config});  // an input of every command: no output may replace it
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return rank0 ? app.exit(e) : 0;  // --help, --version
    return report(lt::cli::parse_error_message(e, app, sub));
  } catch (const lt::Error& e) {
    return report(e.what());
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
    } catch (const lt::CommFault& e) {
      // A collective on device buffers failed or timed out on this rank (comm_wait.h); its peers may
      // be waiting in it: the job is taken down with the rank named, and a status of its own.
      std::fflush(stdout);
      mpi.abort(lt::strcat("llamatrain ", sub->get_name(), ": error: ", e.what()), lt::kExitCommFault);
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
