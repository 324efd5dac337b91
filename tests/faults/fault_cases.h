// The fault suite's bookkeeping (issue 15, item 11). Every fault case is run with a time limit and
// classified:
//   clear      the fault was reported as documented: the expected exit status and a message that
//              names what is wrong (a refusal with status 1, or a damaged checkpoint skipped with a
//              warning)
//   recovered  the fault needed no message: the run recovered and its result is exact (a SIGKILL
//              followed by --resume auto)
//   unclear    it failed cleanly (no signal, no timeout) but not with the expected status or message
//   crash      ended by a signal or with a status >= 128 (124/137 from `timeout` excepted)
//   hang       still running at its time limit
//   silent     silent-wrong: status 0 where an error was expected, or a wrong result
// Each case appends one line to <build>/tests/fault_results/<Suite>.<Test>.tsv; the CTest
// Faults.summary (tests/faults/summarize.sh) runs last, sums the files and fails unless crash,
// hang, silent and unclear are all 0.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "test_util.h"

namespace lt::faults {

enum class Outcome { kClear, kRecovered, kUnclear, kCrash, kHang, kSilentWrong };

inline const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kClear: return "clear";
    case Outcome::kRecovered: return "recovered";
    case Outcome::kUnclear: return "unclear";
    case Outcome::kCrash: return "crash";
    case Outcome::kHang: return "hang";
    default: return "silent";
  }
}

// A run with a time limit: `hung` when `timeout` had to stop it.
struct Run {
  int status = -1;
  bool hung = false;
  std::string out, err;
  double seconds = 0;
};

// Runs a shell command line under `timeout` (SIGTERM at the limit, SIGKILL 5 s later), output
// captured into the per-process scratch directory.
inline Run run_limited(const std::string& command, int limit_s = 120) {
  static std::atomic<int> counter{0};  // runs may come from several threads
  const std::string base = testing::scratch() + "/fault" + std::to_string(counter++);
  // `timeout` makes its own process group and signals all of it, so mpirun and the ranks a
  // command starts are stopped at the limit too.
  const std::string line = "timeout -k 5 " + std::to_string(limit_s) + " sh -c '" + [&] {
    std::string q;
    for (char c : command) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q;
  }() + "' >" + base + ".out 2>" + base + ".err </dev/null";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(line.c_str());
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.hung = r.status == 124 || r.status == 137;  // timeout's own statuses: TERM worked, or KILL was needed
  r.out = testing::slurp(base + ".out");
  r.err = testing::slurp(base + ".err");
  return r;
}

// `llamatrain <args>` under a time limit.
inline Run run_tool(const std::string& args, int limit_s = 120) {
  return run_limited("'" + std::string(LLAMATRAIN_BINARY) + "' " + args, limit_s);
}

// The built-in stories as a dataset of rows of 32 with a trained 300-piece tokenizer (tales.h5 and
// tales.model in the folder returned), the default test split: made once for the build
// (testing::shared_fixture), read only; several fault tests start from it.
inline std::string tales_v300_s32() {
  return testing::shared_fixture("faults-tales-v300-s32", [](const std::string& dir) {
    const Run r = run_tool("prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --seed 1 --output " + dir +
                           "/tales.h5");
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0;
  });
}

// The outcome of a run that should have been refused with `status` and a message containing `needle`.
inline Outcome classify_refusal(const Run& r, int status, const std::string& needle) {
  if (r.hung) return Outcome::kHang;
  if (r.status == 0) return Outcome::kSilentWrong;
  if (r.status >= 128) return Outcome::kCrash;
  // "unexpected error": an exception that is not one of ours (main.cpp), so a path nobody checked.
  if (r.err.find("unexpected error") != std::string::npos) return Outcome::kUnclear;
  if (r.status == status && r.err.find(needle) != std::string::npos) return Outcome::kClear;
  return Outcome::kUnclear;
}

inline std::string results_dir() {
  if (const char* env = std::getenv("LLAMATRAIN_FAULT_RESULTS"); env && *env) return env;
  return LLAMATRAIN_FAULT_RESULTS;
}

// Appends "outcome<TAB>case<TAB>detail" to this test's results file (truncated by its first case
// in this process, so a rerun replaces the test's old lines).
inline void record(const std::string& name, Outcome o, const std::string& detail = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  static std::set<std::string> opened;
  std::filesystem::create_directories(results_dir());
  const std::string path = results_dir() + "/" + test + ".tsv";
  const bool first = opened.insert(path).second;
  std::ofstream f(path, first ? std::ios::trunc : std::ios::app);
  std::string flat = detail.substr(0, 300);
  for (char& c : flat)
    if (c == '\n' || c == '\t') c = ' ';
  f << outcome_name(o) << '\t' << name << '\t' << flat << '\n';
}

// The last line of a text (the error line, usually).
inline std::string last_line(const std::string& s) {
  size_t end = s.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t start = s.rfind('\n', end);
  return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// Classifies, records and checks a case that must be refused with `status` and `needle` in stderr.
inline Outcome expect_refusal(const std::string& name, const Run& r, int status, const std::string& needle) {
  const Outcome o = classify_refusal(r, status, needle);
  record(name, o, o == Outcome::kClear ? last_line(r.err) : "status " + std::to_string(r.status) + ": " + r.err);
  EXPECT_EQ(o, Outcome::kClear) << name << ": " << outcome_name(o) << ", status " << r.status << " (expected "
                                << status << " and '" << needle << "')\n"
                                << r.err.substr(0, 2000);
  return o;
}

// The same for a run without a time limit (testing::run_cli): a hang is then the test's timeout.
inline Outcome expect_refusal(const std::string& name, const testing::CliResult& c, int status,
                              const std::string& needle) {
  Run r;
  r.status = c.status;
  r.out = c.out;
  r.err = c.err;
  return expect_refusal(name, r, status, needle);
}

}  // namespace lt::faults
