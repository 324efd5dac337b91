// The stated range of every numeric option: a CLI11 validator that shows the range in --help
// (`--max-steps INT:>= 1`) and refuses, before any work, a value outside it, NaN, infinities and
// text that is not a number of the option's kind, with one message for the command line and the
// config file alike: "--max-steps 0: expected an integer >= 1". A real option is checked as the
// float or double it is stored in (add_real): "--beta2 0.99999999999: expected a number in [0, 1)
// that a 32-bit float holds".
#pragma once
#include <CLI/CLI.hpp>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/device.h"

namespace lt::cli {

// A value refused by its option's range (thrown from inside CLI11's parse; main reports it).
class OptionError : public Error {
 public:
  OptionError(std::string option, std::string value, std::string expected)
      : Error(option + " " + value + ": expected " + expected),
        option_(std::move(option)),
        value_(std::move(value)),
        expected_(std::move(expected)) {}
  const std::string& option() const { return option_; }
  const std::string& value() const { return value_; }
  const std::string& expected() const { return expected_; }

 private:
  std::string option_, value_, expected_;
};

// An interval of integers or reals; each end closed or open. An upper end that is only the
// limit of the option's C++ type is left out of the help text.
struct NumberRange {
  bool integer = true;
  long double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  bool hi_is_type_limit = false;
  int stored_bits = 0;  // a real option: 32 (float) or 64 (double), the type it is stored in (add_real)

  bool contains(long double v) const;
  std::string help() const;      // ">= 1", "in [0, 1)", "> 0"
  std::string expected() const;  // "an integer >= 1", "a number in [0, 1)"
};

// Integers >= lo (up to what T holds).
template <class T>
NumberRange ints_from(T lo) {
  static_assert(std::is_integral<T>::value, "ints_from is for integer options");
  NumberRange r;
  r.lo = static_cast<long double>(lo);
  r.hi = static_cast<long double>(std::numeric_limits<T>::max());
  r.hi_is_type_limit = true;
  return r;
}
NumberRange ints_between(int lo, int hi);  // [lo, hi]
NumberRange reals_above(double lo);        // (lo, inf)
NumberRange reals_from(double lo);         // [lo, inf)
// bounds: "[]", "[)", "(]" or "()".
NumberRange reals_in(double lo, double hi, const char* bounds);

// Adds the range check to opt (after any transform already on it) and returns opt. An integer
// range only: a real option is added with add_real (a real range without its stored type throws
// std::logic_error here, when the command is set up).
CLI::Option* in_range(CLI::Option* opt, const NumberRange& range);

// sub->add_option(name, variable, description) with range, checked as variable's type holds the
// value: after conversion to it (as CLI11 converts: strtold, then a cast), the value must be
// finite, in the range, and zero only when written as zero (--grad-clip 1e-300 would turn
// clipping off, --top-p 1e-46 becomes 0, --beta2 0.99999999999 becomes 1, --adam-eps 1e400 inf).
template <class T>
CLI::Option* add_real(CLI::App* sub, const std::string& name, T& variable, const std::string& description,
                      NumberRange range) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "add_real is for float and double options");
  range.stored_bits = int(8 * sizeof(T));
  return in_range(sub->add_option(name, variable, description), range);
}

// An option whose words name the values of an enum (`names`, in the help's order): the word is
// parsed to its value here, so no layer below the CLI compares strings; any other word is refused
// as "--recompute some: ... not in {none,attn,full}". The help shows the words and the default's.
template <class E>
CLI::Option* add_choice(CLI::App* sub, const std::string& flag, E& var, const std::vector<std::pair<std::string, E>>& names,
                        const std::string& help) {
  std::string words;
  for (const auto& n : names) words += (words.empty() ? "" : ",") + n.first;
  words = "{" + words + "}";
  CLI::Option* o = sub->add_option(flag, var, help)->type_name("TEXT");
  o->transform(CLI::Validator(
      [names, words](std::string& s) -> std::string {
        for (const auto& [word, value] : names)
          if (s == word) return s = std::to_string(static_cast<int>(value)), std::string();
        return s + " not in " + words;
      },
      words));
  for (const auto& [word, value] : names)
    if (value == var) o->default_str(word);
  return o;
}

// --precision fp32|bf16 (train, eval, generate).
inline CLI::Option* add_precision_choice(CLI::App* sub, Precision& var, const std::string& help) {
  return add_choice(sub, "--precision", var, {{"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}}, help);
}

// --device auto|cpu|cuda|cuda-sim (train, eval, generate): the choice, resolved later (resolve_device).
inline CLI::Option* add_device_choice(CLI::App* sub, DeviceChoice& var, const std::string& help) {
  return add_choice(sub, "--device", var,
                    {{"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda},
                     {"cuda-sim", DeviceChoice::kCudaSim}},
                    help);
}

}  // namespace lt::cli
