#include "llamatrain/utf8.h"

#include <algorithm>
#include <cstdio>

#include "llamatrain/error.h"

namespace lt {

// The ranges are those of Unicode 15, Table 3-7 (Well-Formed UTF-8 Byte Sequences): the narrowed
// second byte after E0/F0 rules out overlongs, after ED surrogates, after F4 code points above
// U+10FFFF; C0, C1 and F5..FF never start a sequence.
size_t utf8_sequence_length(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c == 0xE0) {
    len = 3, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    len = 3;
  } else if (c == 0xED) {
    len = 3, hi = 0x9F;
  } else if (c == 0xF0) {
    len = 4, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    len = 4;
  } else if (c == 0xF4) {
    len = 4, hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len || p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if (p[k] < 0x80 || p[k] > 0xBF) return 0;
  return len;
}

size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(p + i, s.size() - i);
    if (len == 0) return i;
    i += len;
  }
  return std::string::npos;
}

void check_utf8(std::string_view s, const std::string& origin, const std::string& advice) {
  const size_t at = first_invalid_utf8(s);
  if (at == std::string::npos) return;
  const size_t line = 1 + size_t(std::count(s.begin(), s.begin() + std::ptrdiff_t(at), '\n'));
  const size_t line_start = s.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = at == 0 || line_start == std::string::npos ? at + 1 : at - line_start;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", unsigned(static_cast<unsigned char>(s[at])));
  fail(strcat(origin, ": not valid UTF-8 at byte offset ", at, " (line ", line, ", column ", column, ": byte ", byte,
              ")", advice.empty() ? "" : "; ", advice));
}

size_t drop_invalid_utf8(std::string& s, size_t* first) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::string out;
  out.reserve(s.size());
  size_t dropped = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(p + i, s.size() - i);
    if (len == 0) {
      if (dropped++ == 0 && first) *first = i;
      i += 1;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  if (dropped) s.swap(out);
  return dropped;
}

}  // namespace lt
