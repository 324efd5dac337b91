// A trace of ZeRO collectives (train --trace-collectives, include/llamatrain/zero_plan.h) read back
// into calls, grouped by the notes before them: one section per note ("step 3 rounds 2"), the
// calls before the first note in a section with an empty note.
#pragma once
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/zero_plan.h"

namespace lt::testing {

struct ZeroTraceSection {
  std::string note;
  std::vector<ZeroCall> calls;
};

inline std::vector<ZeroTraceSection> read_zero_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(strcat(path, ": cannot read the collective trace"));
  std::vector<ZeroTraceSection> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("# ", 0) == 0) {
      out.push_back({line.substr(2), {}});
      continue;
    }
    std::istringstream words(line);
    std::string op;
    ZeroCall c;
    words >> op >> c.begin >> c.end;
    bool known = false;
    for (ZeroOp k : {ZeroOp::kAllReduce, ZeroOp::kReduceScatter, ZeroOp::kAllGather, ZeroOp::kNormSum})
      if (op == zero_op_name(k)) c.op = k, known = true;
    if (!known || !words) fail(strcat(path, ":", n, ": expected \"<op> <begin> <end>\", got \"", line, "\""));
    if (out.empty()) out.push_back({"", {}});
    out.back().calls.push_back(c);
  }
  return out;
}

}  // namespace lt::testing
