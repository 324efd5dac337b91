#include "cli/ranges.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace lt::cli {

namespace {

std::string number_text(long double v, bool integer) {
  if (integer) return v < 0 ? std::to_string((long long)v) : std::to_string((unsigned long long)v);
  std::ostringstream os;
  os << double(v);
  return os.str();
}

// The whole string as a number of the range's kind; false for anything else (trailing text,
// a fraction or exponent where an integer is wanted, NaN, infinities).
bool parse_number(const std::string& s, bool integer, long double* v) {
  if (s.empty()) return false;
  if (integer) {
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return false;
    for (; i < s.size(); ++i)
      if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  char* end = nullptr;
  *v = std::strtold(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

}  // namespace

bool NumberRange::contains(long double v) const {
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  return hi_open ? v < hi : v <= hi;
}

std::string NumberRange::help() const {
  if (hi_is_type_limit || std::isinf(hi)) return (lo_open ? "> " : ">= ") + number_text(lo, integer);
  return std::string("in ") + (lo_open ? "(" : "[") + number_text(lo, integer) + ", " + number_text(hi, integer) +
         (hi_open ? ")" : "]");
}

std::string NumberRange::expected() const { return (integer ? "an integer " : "a number ") + help(); }

NumberRange ints_between(int lo, int hi) {
  NumberRange r;
  r.lo = lo;
  r.hi = hi;
  return r;
}

NumberRange reals_above(double lo) {
  NumberRange r = reals_from(lo);
  r.lo_open = true;
  return r;
}

NumberRange reals_from(double lo) {
  NumberRange r;
  r.integer = false;
  r.lo = lo;
  r.hi = std::numeric_limits<long double>::infinity();
  return r;
}

NumberRange reals_in(double lo, double hi, const char* bounds) {
  NumberRange r;
  r.integer = false;
  r.lo = lo;
  r.hi = hi;
  r.lo_open = bounds[0] == '(';
  r.hi_open = bounds[1] == ')';
  return r;
}

CLI::Option* in_range(CLI::Option* opt, const NumberRange& range) {
  const std::string name = opt->get_name();
  if (!range.integer && range.stored_bits != 32 && range.stored_bits != 64)
    throw std::logic_error(name + ": a real option is added with add_real, which checks it as stored");
  CLI::Validator check(
      [range, name](std::string& value) -> std::string {
        long double v = 0;
        if (!parse_number(value, range.integer, &v)) throw OptionError(name, value, range.expected());
        if (!range.integer && range.contains(v)) {
          // In range as written: it must stay so as stored, and not become inf or a zero.
          const long double stored = range.stored_bits == 32 ? static_cast<long double>(static_cast<float>(v))
                                                             : static_cast<long double>(static_cast<double>(v));
          if (std::isfinite(stored) && (stored != 0 || v == 0) && range.contains(stored)) return std::string();
          throw OptionError(name, value, strcat(range.expected(), " that a ", range.stored_bits, "-bit float holds"));
        }
        if (range.contains(v)) return std::string();
        // Beyond what the option's type holds: say so, as the help text leaves that end out.
        const bool too_big = range.hi_is_type_limit && v > range.hi;
        throw OptionError(name, value,
                          range.expected() + (too_big ? " and <= " + number_text(range.hi, true) : std::string()));
      },
      range.help());
  return opt->check(check);
}

}  // namespace lt::cli
