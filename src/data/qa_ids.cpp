// Id lists (prepare --test-ids, eval --ids): a JSON array, a JSON object keyed by id, or one id per
// line. JSON passes through the depth-bounded reader like every other JSON input.
#include <nlohmann/json.hpp>

#include <set>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/json_read.h"
#include "llamatrain/qa.h"

namespace lt {
namespace {

constexpr const char* kIdSpace = " \t\r\n\v\f";

// Adds id (with its label) unless it is there already.
void add_id(IdList& out, std::set<std::string>& seen, const std::string& id, const std::string& label) {
  if (seen.insert(id).second) {
    out.ids.push_back(id);
    out.labels.push_back(label);
  }
}

void read_json_ids(IdList& out, const std::string& path, const std::string& text) {
  // As parse_json_file_text, but keeping an object's keys in the file's order.
  check_json_depth(text, path);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(strcat(path, ": not valid JSON (", e.what(), ")"));
  }
  std::set<std::string> seen;
  if (j.is_object()) {
    out.format = "json-object";
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it.value().is_string())
        fail(strcat(path, ": the label of id '", it.key(), "' is ", it.value().type_name(),
                    ", not a string (yes, no or maybe)"));
      std::string label = it.value().get<std::string>();
      const size_t b = label.find_first_not_of(kIdSpace);
      label = b == std::string::npos ? std::string() : label.substr(b, label.find_last_not_of(kIdSpace) - b + 1);
      for (char& ch : label)
        if (ch >= 'A' && ch <= 'Z') ch = char(ch - 'A' + 'a');
      if (label != "yes" && label != "no" && label != "maybe")
        fail(strcat(path, ": the label of id '", it.key(), "' is '", it.value().get<std::string>(),
                    "', expected yes, no or maybe"));
      add_id(out, seen, it.key(), label);
    }
    return;
  }
  if (!j.is_array()) fail(strcat(path, ": expected a JSON array of ids, a JSON object keyed by id, or one id per line"));
  out.format = "json-array";
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    if (!v.is_string() && !v.is_number_integer())
      fail(strcat(path, ": element [", i, "] is ", v.type_name(), ", not an id (a string or an integer)"));
    add_id(out, seen, v.is_string() ? v.get<std::string>() : v.dump(), "");
  }
}

void read_line_ids(IdList& out, const std::string& text) {
  out.format = "lines";
  std::set<std::string> seen;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const size_t b = line.find_first_not_of(kIdSpace);
    if (b == std::string::npos) continue;
    add_id(out, seen, line.substr(b, line.find_last_not_of(kIdSpace) - b + 1), "");
  }
}

}  // namespace

std::string quoted_ids(const std::vector<std::string>& ids, size_t shown) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < shown; ++i) out += strcat(i ? ", '" : "'", ids[i], "'");
  return ids.size() > shown ? out + ", ..." : out;
}

IdList read_id_file(const std::string& path) {
  std::string text = read_file_bytes(path);
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.replace(0, 3, "   ");
  if (!is_valid_utf8(text)) fail(strcat(path, ": not valid UTF-8"));
  IdList out;
  const size_t first = text.find_first_not_of(kIdSpace);
  if (first != std::string::npos && (text[first] == '[' || text[first] == '{')) read_json_ids(out, path, text);
  else read_line_ids(out, text);
  if (out.ids.empty()) fail(strcat(path, ": no ids"));
  return out;
}

}  // namespace lt
