// Errors: every failure becomes an lt::Error carrying what went wrong and where. The CLI turns
// it into one message (rank 0 for errors all ranks see alike) and a non-zero exit.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace lt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An error every rank raised alike (or agreed on, see agree() in comm.h): rank 0 reports it once
// and every rank exits cleanly. Any other Error seen by one rank of a multi-rank job aborts the
// job with the rank named, since its peers may be waiting in a collective.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Builds a message from any streamable pieces: lt::strcat("file ", path, ": ", n, " bytes").
template <class... Args>
std::string strcat(const Args&... args) {
  return detail::concat(args...);
}

[[noreturn]] inline void fail(const std::string& what) { throw Error(what); }

}  // namespace lt

// LT_CHECK(cond, pieces...): throws lt::Error("pieces... [file:line]") when cond is false.
// For internal invariants; user-facing errors name the file/field instead of our source line.
#define LT_CHECK(cond, ...)                                                           \
  do {                                                                                \
    if (!(cond))                                                                      \
      throw ::lt::Error(::lt::strcat(__VA_ARGS__, " [", __FILE__, ":", __LINE__, "]")); \
  } while (0)

// LT_API_CHECK(library, call, ok, describe): the one generator behind the checks of external API
// calls (CUDA runtime, cuBLASLt, NCCL): evaluates `call` once; unless ok(status), throws
// lt::Error("<library> call failed: <call text>: describe(status) [file:line]"). The rank and host
// are added where the error is reported (src/cli/main.cpp).
#define LT_API_CHECK(library, call, ok, describe)                                                  \
  do {                                                                                             \
    const auto lt_api_status_ = (call);                                                            \
    if (!(ok(lt_api_status_)))                                                                     \
      throw ::lt::Error(::lt::strcat(library, " call failed: ", #call, ": ", describe(lt_api_status_), \
                                     " [", __FILE__, ":", __LINE__, "]"));                         \
  } while (0)
