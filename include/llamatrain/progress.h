// A progress bar / status line on stderr. Draws only when the task has run for more than
// `delay_s` seconds, redraws at most ~10 times a second, uses '\r' on a terminal and plain
// periodic lines (every `log_every_s`) otherwise, so batch logs stay readable.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace lt {

class Progress {
 public:
  Progress(std::string label, int64_t total, std::string unit, double delay_s = 1.5,
           double log_every_s = 30.0);
  ~Progress();
  void update(int64_t done, const std::string& extra = "");
  void finish();  // final line (only if anything was drawn)

 private:
  std::string label_, unit_;
  int64_t total_;
  double delay_s_, log_every_s_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false, finished_ = false, tty_;
};

}  // namespace lt
