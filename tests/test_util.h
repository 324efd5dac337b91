// Helpers shared by the tests: scratch directories, error capture, and running the llamatrain
// binary as a user would.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace lt::testing {

inline const std::string kSharedData = LLAMATRAIN_SHARED_DATA;

// A fresh directory for the current test: /tmp/lt_<suite>_<test>_<pid>.
inline std::filesystem::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::ostringstream name;
  name << "lt_" << (info ? info->test_suite_name() : "none") << "_" << (info ? info->name() : "none") << "_"
       << ::getpid();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name.str();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A per-process scratch directory, for fixtures shared by several tests of one process.
inline const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/llamatrain_test_XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  return dir;
}

// The message of the exception f throws, or "<no error>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CliResult {
  int status = -1;
  std::string out, err;
};

// Runs a shell command line with stdout and stderr captured into the scratch directory.
inline CliResult run_captured(const std::string& command) {
  static int counter = 0;
  const std::string base = scratch() + "/run" + std::to_string(counter++);
  const int rc = std::system((command + " >" + base + ".out 2>" + base + ".err </dev/null").c_str());
  CliResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

// Runs `llamatrain <args>` (a shell command line: quote as needed) and captures everything; with
// `threads` > 0, on that many threads.
inline CliResult run_cli(const std::string& args, int threads = 0) {
  const std::string env = threads > 0 ? "env OMP_NUM_THREADS=" + std::to_string(threads) + " " : "";
  return run_captured(env + "'" + LLAMATRAIN_BINARY + "' " + args);
}

// A fixture made once for all the test processes of this build (CTest runs every test in a process
// of its own, so a function-local static is made again by each): `make(dir)` fills a new directory
// and returns whether it succeeded; the first process to ask makes it under a lock
// (<build>/fixture-cache/<name>.lock) and publishes it as <build>/fixture-cache/<name>, the others
// wait and use that. A fixture must be what every test would have made itself (fixed seeds, the
// same command): the cache saves time only. It is made again when the llamatrain binary changes
// (its size and modification time are the stamp). A failed make publishes nothing and returns its
// directory, so the test that asked goes on to fail on what is missing.
inline std::string shared_fixture(const std::string& name, const std::function<bool(const std::string&)>& make) {
  namespace fs = std::filesystem;
  const fs::path cache = fs::path(LLAMATRAIN_BINARY).parent_path() / "fixture-cache";
  fs::create_directories(cache);
  struct stat st {};
  ::stat(LLAMATRAIN_BINARY, &st);
  const std::string stamp = std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
                            std::to_string(st.st_mtim.tv_nsec) + " " + name;
  const fs::path dir = cache / name, stamp_file = cache / (name + ".stamp");
  const int lock = ::open((cache / (name + ".lock")).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  std::string result = dir.string();
  if (slurp(stamp_file.string()) != stamp || !fs::is_directory(dir)) {
    fs::remove(stamp_file);
    fs::remove_all(dir);
    const fs::path fresh = cache / (name + ".making." + std::to_string(::getpid()));
    fs::remove_all(fresh);
    fs::create_directories(fresh);
    if (make(fresh.string())) {
      fs::rename(fresh, dir);
      std::ofstream(stamp_file) << stamp;
    } else {
      result = fresh.string();
    }
  }
  if (lock >= 0) ::close(lock);  // releases the lock
  return result;
}

#ifdef LLAMATRAIN_MPIEXEC
// `mpirun -np <np> llamatrain ` the way CI must run it: oversubscribed (3 ranks on 2 cores), as
// root when we are root, with the thread count left to llamatrain (cores / ranks per node), or
// `threads` per rank when given. The thread count reaches the ranks through mpirun's own
// environment, which local ranks inherit, not `-x`: Open MPI refuses `-x` beside the
// mca_base_env_list that the sanitizer stage sets (scripts/test-sanitize.sh).
inline std::string mpirun_llamatrain(int np, int threads = 0) {
  const std::string threads_env =
      threads > 0 ? "OMP_NUM_THREADS=" + std::to_string(threads) : std::string("-u OMP_NUM_THREADS");
  std::string launcher = "env -u OPENBLAS_NUM_THREADS " + threads_env + " '" + LLAMATRAIN_MPIEXEC +
                         "' --oversubscribe --bind-to none";
  if (::geteuid() == 0) launcher += " --allow-run-as-root";
  return launcher + " -np " + std::to_string(np) + " '" + LLAMATRAIN_BINARY + "' ";
}

inline CliResult run_mpi(int np, const std::string& args, int threads = 0) {
  return run_captured(mpirun_llamatrain(np, threads) + args);
}
#endif

}  // namespace lt::testing
