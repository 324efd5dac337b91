// Runs the llamatrain binary as a user would and captures its exit status, stdout and stderr.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace lt::testing {

struct CliResult {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A per-process scratch directory under /tmp.
inline const std::string& scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/llamatrain_cli_XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  return dir;
}

// `args` is appended to the binary path as a shell command line (quote as needed).
inline CliResult run_cli(const std::string& args) {
  static int counter = 0;
  const std::string base = scratch() + "/run" + std::to_string(counter++);
  const std::string cmd = std::string("'") + LLAMATRAIN_BINARY + "' " + args + " >" + base + ".out 2>" + base + ".err </dev/null";
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

}  // namespace lt::testing
