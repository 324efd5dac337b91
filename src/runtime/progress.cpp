// Progress reporting on stderr. On a terminal one line is redrawn in place with '\r'; in a batch
// log (stderr redirected) a plain line is printed every log_every_s seconds instead, so a Slurm
// log shows progress without thousands of carriage-return updates.
#include "llamatrain/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "llamatrain/error.h"

namespace lt {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// 1234567 -> "1.23M": counts of bytes or tokens stay short in a status line.
std::string human_count(int64_t n) {
  const char* suffix[] = {"", "k", "M", "G", "T"};
  double v = static_cast<double>(n);
  int s = 0;
  while (v >= 1000.0 && s < 4) {
    v /= 1000.0;
    ++s;
  }
  char buf[32];
  if (s == 0)
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(n));
  else
    std::snprintf(buf, sizeof(buf), "%.*f%s", v < 10 ? 2 : (v < 100 ? 1 : 0), v, suffix[s]);
  return buf;
}

std::string human_time(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof(buf), "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof(buf), "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

// "label [#####.....]  45% 1.23M/2.70M tokens 3.2s eta 4.0s extra"; without a known total
// only the count and the elapsed time.
std::string status_line(const std::string& label, int64_t done, int64_t total,
                        const std::string& unit, double elapsed, const std::string& extra,
                        bool bar) {
  std::string line = label;
  if (total > 0) {
    const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
    if (bar) {
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(frac * kWidth);
      line += " [" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "]";
    }
    char pct[16];
    std::snprintf(pct, sizeof(pct), " %3d%%", static_cast<int>(frac * 100.0));
    line += strcat(pct, " ", human_count(done), "/", human_count(total), " ", unit, " ",
                   human_time(elapsed));
    if (frac > 0 && frac < 1) line += " eta " + human_time(elapsed * (1 - frac) / frac);
  } else {
    line += strcat(" ", human_count(done), " ", unit, " ", human_time(elapsed));
  }
  if (!extra.empty()) line += " " + extra;
  return line;
}

}  // namespace

Progress::Progress(std::string label, int64_t total, std::string unit, double delay_s,
                   double log_every_s)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      delay_s_(delay_s),
      log_every_s_(log_every_s),
      start_(Clock::now()),
      last_draw_(start_),
      tty_(::isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() {
  // An exception may unwind past an unfinished bar: end the '\r' line so the error message
  // that follows starts on a line of its own.
  if (drawn_ && !finished_ && tty_) std::fputc('\n', stderr);
}

void Progress::update(int64_t done, const std::string& extra) {
  if (finished_) return;
  const auto now = Clock::now();
  const double elapsed = seconds_between(start_, now);
  if (elapsed < delay_s_) return;
  const double since = seconds_between(last_draw_, now);
  if (tty_) {
    if (drawn_ && since < 0.1) return;
    // Trailing spaces wipe what a longer previous line left behind.
    std::fprintf(stderr, "\r%s   ", status_line(label_, done, total_, unit_, elapsed, extra, true).c_str());
  } else {
    if (drawn_ && since < log_every_s_) return;
    std::fprintf(stderr, "%s\n", status_line(label_, done, total_, unit_, elapsed, extra, false).c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = now;
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!drawn_) return;
  const double elapsed = seconds_between(start_, Clock::now());
  // The final count is the total; with no total known only the time is meaningful.
  const std::string line = total_ > 0
                               ? status_line(label_, total_, total_, unit_, elapsed, "done", tty_)
                               : strcat(label_, " done in ", human_time(elapsed));
  std::fprintf(stderr, tty_ ? "\r%s   \n" : "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace lt
