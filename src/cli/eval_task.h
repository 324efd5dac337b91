// `llamatrain eval --task pubmedqa` (eval_task.cpp), called by run_eval.
#pragma once
#include <cstdint>
#include <string>

#include "cli/commands.h"
#include "llamatrain/progress.h"

namespace lt::cli {

int run_eval_task(const EvalOptions& opt);

// Progress on stderr as train shows it: from the start, redrawn on a terminal, a plain line every
// 30 s in a log; with --no-progress never (the delay never passes). Defined in cmd_eval.cpp.
Progress eval_progress(const EvalOptions& opt, const std::string& label, int64_t total, const char* unit);

}  // namespace lt::cli
