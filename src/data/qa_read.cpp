// Reading question/answer records: format detection (JSON lines, a JSON array, PubMedQA's
// ori_pqal.json), one check per record with a message naming the file and the line, element or
// key, and the UTF-8 check.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <string_view>
#include <utility>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/json_read.h"
#include "llamatrain/qa.h"
#include "llamatrain/utf8.h"

namespace lt {
namespace {

// Ordered, so that the records of ori_pqal.json keep the file's order (nlohmann::json sorts keys).
using Json = nlohmann::ordered_json;

constexpr size_t kNpos = std::string::npos;
constexpr std::string_view kSpace = " \t\r\n\v\f";

// nlohmann::json refuses to parse invalid UTF-8, which would turn a bad byte in one field into
// "not valid JSON" for the whole line or file. Each invalid byte is therefore replaced by U+FFFF
// (a noncharacter, valid UTF-8, absent from real text) before parsing, and a record whose
// strings contain U+FFFF after such a replacement is reported as not valid UTF-8.
constexpr std::string_view kBadByte = "\xEF\xBF\xBF";

// s with every byte outside a well-formed sequence replaced by kBadByte.
std::string replace_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(p + i, s.size() - i);
    if (len == 0) {
      out += kBadByte;
      i += 1;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

bool has_bad_byte(const std::string& s) { return s.find(kBadByte) != kNpos; }

bool has_bad_byte(const Json& v) {
  if (v.is_string()) return has_bad_byte(v.get_ref<const std::string&>());
  if (v.is_array()) return std::any_of(v.begin(), v.end(), [](const Json& e) { return has_bad_byte(e); });
  if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it)
      if (has_bad_byte(it.key()) || has_bad_byte(it.value())) return true;
  return false;
}

// A key for a message: the replacement character shows where the bad bytes were.
std::string printable(const std::string& s) {
  std::string out = s;
  for (size_t at = out.find(kBadByte); at != kNpos; at = out.find(kBadByte, at + 3)) out.replace(at, 3, "\xEF\xBF\xBD");
  return out;
}

bool is_blank(std::string_view s) { return s.find_first_not_of(kSpace) == kNpos; }

std::string trimmed_lower(const std::string& s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == kNpos) return "";
  const size_t e = s.find_last_not_of(kSpace);
  std::string out = s.substr(b, e - b + 1);
  for (char& ch : out) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

struct ParseResult {
  Json value;                  // discarded when parsing failed
  size_t error_byte = 0;       // nlohmann's parse_error::byte: 1-based offset of the last byte read
  std::string error_detail;    // the parse error without nlohmann's "[json.exception...] parse error at ...: "
  bool too_deep = false;       // refused before parsing: nested deeper than kMaxJsonDepth (error_byte: where)
  bool ok() const { return !value.is_discarded(); }
  // "not valid JSON (parse error at byte 12: ...)", or the depth refusal; `where` names the byte.
  std::string problem(const std::string& where) const {
    if (too_deep) return strcat("JSON nests deeper than ", kMaxJsonDepth, " levels (arrays and objects) at ", where);
    return strcat("not valid JSON (parse error at ", where, ": ", error_detail, ")");
  }
};

// Parses s (bad bytes replaced); never throws. Text nested deeper than kMaxJsonDepth is refused
// unparsed: walking such a value would overflow the stack.
ParseResult parse_json(std::string_view s, bool has_invalid_utf8) {
  ParseResult r;
  if (const size_t deep = json_too_deep_at(s); deep != std::string_view::npos) {
    r.value = Json(Json::value_t::discarded);
    r.error_byte = deep + 1;
    r.too_deep = true;
    return r;
  }
  try {
    if (has_invalid_utf8) {
      const std::string clean = replace_invalid_utf8(s);
      r.value = Json::parse(clean.begin(), clean.end());
    } else {
      r.value = Json::parse(s.begin(), s.end());
    }
  } catch (const Json::parse_error& e) {
    r.value = Json(Json::value_t::discarded);
    r.error_byte = e.byte;
    const std::string what = e.what();
    const size_t at = what.find(": ", what.find("parse error"));
    r.error_detail = at == kNpos ? what : what.substr(at + 2);
  }
  return r;
}

bool parses_as_object(std::string_view s) {
  if (s.find('{') == kNpos) return false;  // cheap rejection of plain text
  return parse_json(s, first_invalid_utf8(s) != kNpos).value.is_object();
}

// --- records -------------------------------------------------------------------------------

// A problem with one record: becomes "<origin>: <what>".
struct RecordProblem {
  std::string what;
};

[[noreturn]] void problem(std::string what) { throw RecordProblem{std::move(what)}; }

// Called on a record parsed from text with replaced bytes: names the first field that had them.
void check_utf8(const Json& rec) {
  if (!rec.is_object()) {
    if (has_bad_byte(rec)) problem("not valid UTF-8");
    return;
  }
  for (auto it = rec.begin(); it != rec.end(); ++it)
    if (has_bad_byte(it.key()) || has_bad_byte(it.value()))
      problem(strcat("field \"", printable(it.key()), "\" is not valid UTF-8"));
}

void check_object(const Json& rec) {
  if (!rec.is_object()) problem(strcat("not a JSON object (found ", rec.type_name(), ")"));
}

// A required, non-blank string field; `role` names it in "empty <role>".
std::string required_text(const Json& rec, const char* name, const char* role) {
  const auto it = rec.find(name);
  if (it == rec.end()) problem(strcat("missing field \"", name, "\""));
  if (!it->is_string()) problem(strcat("field \"", name, "\" is not a string"));
  const std::string& s = it->get_ref<const std::string&>();
  if (is_blank(s)) problem(strcat("empty ", role));
  return s;
}

// An optional string field: absent or null give "".
std::string optional_text(const Json& rec, const char* name) {
  const auto it = rec.find(name);
  if (it == rec.end() || it->is_null()) return "";
  if (!it->is_string()) problem(strcat("field \"", name, "\" is not a string"));
  return it->get_ref<const std::string&>();
}

// The first present, non-null one of the id fields, as text; "" when there is none.
std::string optional_id(const Json& rec, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const auto it = rec.find(name);
    if (it == rec.end() || it->is_null()) continue;
    if (it->is_string()) return it->get_ref<const std::string&>();
    if (it->is_number_integer()) return it->dump();
    problem(strcat("field \"", name, "\" is not a string or integer"));
  }
  return "";
}

// The first present label field, lower-cased: "yes", "no", "maybe" or "".
std::string optional_label(const Json& rec, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const auto it = rec.find(name);
    if (it == rec.end() || it->is_null()) continue;
    if (!it->is_string()) problem(strcat("field \"", name, "\" is not a string"));
    std::string label = trimmed_lower(it->get_ref<const std::string&>());
    if (label != "yes" && label != "no" && label != "maybe" && !label.empty())
      problem(strcat("field \"", name, "\" is \"", it->get_ref<const std::string&>(), "\", not yes, no or maybe"));
    return label;
  }
  return "";
}

// A record of JSON lines or a JSON array; fallback_id is "line:<n>" / "index:<i>".
void flat_record(QaRecord& out, const Json& rec, const std::string& fallback_id) {
  check_object(rec);
  out.question = required_text(rec, "question", "question");
  out.answer = required_text(rec, "answer", "answer");
  out.context = optional_text(rec, "context");
  out.id = optional_id(rec, {"id", "pubid"});
  if (out.id.empty()) out.id = fallback_id;
  out.label = optional_label(rec, {"final_decision", "label"});
}

// An entry of ori_pqal.json: CONTEXTS (the abstract's labelled sections) joined with " ".
void pubmedqa_record(QaRecord& out, const std::string& key, const Json& rec) {
  check_object(rec);
  out.id = key;
  out.question = required_text(rec, "QUESTION", "question");
  out.answer = required_text(rec, "LONG_ANSWER", "answer");
  const auto it = rec.find("CONTEXTS");
  if (it != rec.end() && !it->is_null()) {
    if (it->is_string()) {
      out.context = it->get_ref<const std::string&>();
    } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const Json& e) { return e.is_string(); })) {
      for (const Json& part : *it) {
        if (!out.context.empty()) out.context += ' ';
        out.context += part.get_ref<const std::string&>();
      }
    } else {
      problem("field \"CONTEXTS\" is not an array of strings");
    }
  }
  out.label = optional_label(rec, {"final_decision"});
}

bool looks_like_pubmedqa(const Json& v) {
  if (!v.is_object()) return false;
  return std::any_of(v.begin(), v.end(), [](const Json& e) { return e.is_object() && e.contains("QUESTION"); });
}

// Collects records, turning each RecordProblem into an error or, with skip_invalid, a listed skip.
class Collector {
 public:
  Collector(const QaReadOptions& opt, QaReadReport* report) : opt_(opt), report_(report) {}

  void add(const std::string& origin, const std::function<void(QaRecord&)>& make) {
    ++report_->records;
    QaRecord rec;
    try {
      make(rec);
    } catch (const RecordProblem& p) {
      std::string message = origin + ": " + p.what;
      if (!opt_.skip_invalid) throw Error(message);
      ++report_->invalid;
      report_->problems.push_back(std::move(message));
      return;
    }
    rec.origin = origin;
    records_.push_back(std::move(rec));
  }

  std::vector<QaRecord> take() { return std::move(records_); }

 private:
  const QaReadOptions& opt_;
  QaReadReport* report_;
  std::vector<QaRecord> records_;
};

// --- formats -------------------------------------------------------------------------------

// 1-based line and byte-in-line of a 1-based byte offset.
std::pair<size_t, size_t> line_and_column(const std::string& text, size_t byte) {
  const size_t end = std::min(byte == 0 ? 0 : byte - 1, text.size());
  const size_t line = 1 + size_t(std::count(text.begin(), text.begin() + end, '\n'));
  const size_t line_start = end == 0 ? 0 : text.rfind('\n', end - 1);
  const size_t column = line_start == kNpos ? end + 1 : end - line_start;
  return {line, column};
}

[[noreturn]] void fail_parse(const std::string& path, const std::string& text, const ParseResult& r) {
  const auto [line, column] = line_and_column(text, r.error_byte);
  fail(strcat(path, ":", line, ": ", r.problem(strcat("byte ", column))));
}

void read_json_lines(Collector& out, const std::string& path, const std::string& text) {
  size_t line_no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == kNpos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    ++line_no;
    begin = end + 1;
    if (is_blank(line)) continue;
    out.add(strcat(path, ":", line_no), [&](QaRecord& rec) {
      const size_t bad = first_invalid_utf8(line);
      const ParseResult r = parse_json(line, bad != kNpos);
      if (!r.ok()) {
        if (bad != kNpos && !r.too_deep) problem(strcat("not valid UTF-8 (byte ", bad + 1, ")"));
        problem(r.problem(strcat("byte ", r.error_byte)));
      }
      if (bad != kNpos) check_utf8(r.value);
      flat_record(rec, r.value, strcat("line:", line_no));
    });
  }
}

void read_json_array(Collector& out, const std::string& path, const Json& doc, bool bad_utf8) {
  for (size_t i = 0; i < doc.size(); ++i)
    out.add(strcat(path, ":[", i, "]"), [&](QaRecord& rec) {
      if (bad_utf8) check_utf8(doc[i]);
      flat_record(rec, doc[i], strcat("index:", i));
    });
}

void read_pubmedqa_dict(Collector& out, const std::string& path, const Json& doc, bool bad_utf8) {
  for (auto it = doc.begin(); it != doc.end(); ++it)
    out.add(strcat(path, ":", printable(it.key())), [&](QaRecord& rec) {
      if (bad_utf8) {
        if (has_bad_byte(it.key())) problem("key is not valid UTF-8");
        check_utf8(it.value());
      }
      pubmedqa_record(rec, it.key(), it.value());
    });
}

// Some line after the first non-blank one parses alone as a JSON object: the file is JSON lines
// whose first record is broken, not a broken single JSON document.
bool later_line_is_object(const std::string& text, size_t first_line_end) {
  for (size_t begin = first_line_end; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == kNpos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    const size_t first = line.find_first_not_of(kSpace);
    if (first != kNpos && line[first] == '{' && parses_as_object(line)) return true;
    begin = end + 1;
  }
  return false;
}

[[noreturn]] void fail_not_pubmedqa(const std::string& path) {
  fail(strcat(path,
              ": a JSON object that is not PubMedQA's ori_pqal.json (no value is an object with \"QUESTION\"); "
              "expected JSON lines, a JSON array or ori_pqal.json"));
}

}  // namespace

bool is_valid_utf8(const std::string& s) { return first_invalid_utf8(s) == kNpos; }

std::vector<QaRecord> read_qa_file(const std::string& path, const QaReadOptions& opt, QaReadReport* report) {
  QaReadReport local;
  if (report == nullptr) report = &local;
  *report = QaReadReport{};

  std::string text = read_file_bytes(path);
  // A UTF-8 byte-order mark becomes spaces, so that offsets and line numbers stay those of the file.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.replace(0, 3, "   ");
  const size_t first = text.find_first_not_of(kSpace);
  if (first == kNpos) fail(strcat(path, ": empty; expected JSON lines, a JSON array or PubMedQA's ori_pqal.json"));

  Collector out(opt, report);
  const bool bad_utf8 = first_invalid_utf8(text) != kNpos;
  size_t first_line_end = text.find('\n', first);
  if (first_line_end == kNpos) first_line_end = text.size();

  if (text[first] == '[') {
    const ParseResult doc = parse_json(text, bad_utf8);
    if (!doc.ok()) fail_parse(path, text, doc);
    report->format = "json-array";
    read_json_array(out, path, doc.value, bad_utf8);
    return out.take();
  }

  if (text[first] == '{') {
    // JSON lines also start with '{': the first line alone decides when it is a whole object.
    const std::string_view line1(text.data() + first, first_line_end - first);
    const ParseResult head = parse_json(line1, first_invalid_utf8(line1) != kNpos);
    if (head.value.is_object()) {
      const bool single_line = is_blank(std::string_view(text).substr(first_line_end));
      if (single_line && !head.value.contains("question") && looks_like_pubmedqa(head.value)) {
        report->format = "pubmedqa-dict";
        read_pubmedqa_dict(out, path, head.value, bad_utf8);
        return out.take();
      }
      report->format = "jsonl";
      read_json_lines(out, path, text);
      return out.take();
    }
    const ParseResult doc = parse_json(text, bad_utf8);
    if (doc.value.is_object()) {
      if (doc.value.contains("question"))
        fail(strcat(path, ": one JSON object spread over several lines; JSON lines need one record per line"));
      if (!looks_like_pubmedqa(doc.value)) fail_not_pubmedqa(path);
      report->format = "pubmedqa-dict";
      read_pubmedqa_dict(out, path, doc.value, bad_utf8);
      return out.take();
    }
    if (!later_line_is_object(text, first_line_end)) fail_parse(path, text, doc);
    report->format = "jsonl";
    read_json_lines(out, path, text);
    return out.take();
  }

  // Neither '[' nor '{': JSON lines with a broken first line, or not a question/answer file.
  if (!later_line_is_object(text, first_line_end)) {
    const size_t line = line_and_column(text, first + 1).first;
    const auto c = static_cast<unsigned char>(text[first]);
    char shown[8];
    std::snprintf(shown, sizeof shown, c >= 0x20 && c < 0x7F ? "'%c'" : "0x%02X", c);
    fail(strcat(path, ": not JSON lines, a JSON array or PubMedQA's ori_pqal.json (line ", line, " starts with ",
                shown, ")"));
  }
  report->format = "jsonl";
  read_json_lines(out, path, text);
  return out.take();
}

}  // namespace lt
