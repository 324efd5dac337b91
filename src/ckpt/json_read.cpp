#include "llamatrain/json_read.h"

#include <algorithm>

#include "llamatrain/error.h"

namespace lt {

size_t json_too_deep_at(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"' || c == '\n')  // a raw newline ends no JSON string; the parser says so
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

void check_json_depth(std::string_view text, const std::string& origin, int64_t first_line, int max_depth) {
  const size_t at = json_too_deep_at(text, max_depth);
  if (at == std::string_view::npos) return;
  const std::string_view before = text.substr(0, at);
  const size_t line_start = before.rfind('\n');
  const int64_t line = first_line + std::count(before.begin(), before.end(), '\n');
  const size_t column = line_start == std::string_view::npos ? at + 1 : at - line_start;
  fail(strcat(origin, ":", line, ":", column, ": JSON nests deeper than ", max_depth, " levels (arrays and objects)"));
}

nlohmann::json parse_json_file_text(std::string_view text, const std::string& origin) {
  check_json_depth(text, origin);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    fail(strcat(origin, ": not valid JSON (", e.what(), ")"));
  }
}

nlohmann::json parse_json_object_text(std::string_view text, const std::string& origin) {
  check_json_depth(text, origin);
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(strcat(origin, ": not valid JSON"));
  if (!j.is_object()) fail(strcat(origin, ": not a JSON object"));
  return j;
}

}  // namespace lt
