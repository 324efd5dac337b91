#include "cli/config_file.h"

#include <cctype>
#include <map>
#include <sstream>

#include "cli/ranges.h"
#include "cli/suggest.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt::cli {

namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

// A cursor over one line; errors name the origin and line.
struct LineReader {
  const std::string& s;
  size_t i = 0;
  std::string at;  // "<origin>:<line>: "

  void skip_space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool done() const { return i >= s.size() || s[i] == '#'; }
  [[noreturn]] void error(const std::string& what) const { fail(at + what); }

  std::string name(const char* what) {
    const size_t start = i;
    while (i < s.size() && is_name_char(s[i])) ++i;
    if (i == start) error(strcat("expected ", what, " at column ", start + 1, " of: ", s));
    return s.substr(start, i - start);
  }

  std::string quoted() {
    const char q = s[i++];
    std::string out;
    while (i < s.size() && s[i] != q) {
      char c = s[i++];
      if (q == '"' && c == '\\') {
        if (i >= s.size()) break;
        const char e = s[i++];
        const std::map<char, char> escapes = {{'"', '"'}, {'\\', '\\'}, {'n', '\n'}, {'t', '\t'}, {'r', '\r'}};
        const auto it = escapes.find(e);
        if (it == escapes.end()) error(strcat("unsupported escape \\", e, " in a string (use \\\" \\\\ \\n \\t \\r)"));
        c = it->second;
      }
      out += c;
    }
    if (i >= s.size()) error(strcat("unterminated string: ", s.substr(0, s.size())));
    ++i;
    return out;
  }

  // A bare scalar: true, false or a TOML number (underscores between digits dropped).
  std::string bare(ConfigValueKind* kind) {
    const size_t start = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i])) && s[i] != ',' && s[i] != ']' && s[i] != '#')
      ++i;
    const std::string word = s.substr(start, i - start);
    if (word == "true" || word == "false") {
      *kind = ConfigValueKind::boolean;
      return word;
    }
    std::string number;
    for (char c : word)
      if (c != '_') number += c;
    char* end = nullptr;
    std::strtod(number.c_str(), &end);
    const bool numeric = !number.empty() && end == number.c_str() + number.size() &&
                         (std::isdigit(static_cast<unsigned char>(number[0])) || number[0] == '+' || number[0] == '-' ||
                          number[0] == '.' || number == "nan" || number == "inf");
    if (!numeric)
      error(word.empty() ? strcat("expected a value at column ", start + 1, " of: ", s)
                         : strcat(word, ": not a number, true/false or a quoted string (a string needs quotes: \"",
                                  word, "\")"));
    *kind = ConfigValueKind::number;
    return number;
  }

  std::string scalar(ConfigValueKind* kind) {
    if (i < s.size() && (s[i] == '"' || s[i] == '\'')) {
      *kind = ConfigValueKind::string;
      return quoted();
    }
    return bare(kind);
  }

  void value(ConfigEntry& e) {
    const size_t start = i;
    if (i < s.size() && s[i] == '[') {
      ++i;
      e.kind = ConfigValueKind::array;
      for (skip_space(); i < s.size() && s[i] != ']'; skip_space()) {
        ConfigValueKind k;
        e.values.push_back(scalar(&k));
        e.element_kinds.push_back(k);
        skip_space();
        if (i < s.size() && s[i] == ',')
          ++i;
        else if (i < s.size() && s[i] != ']')
          error(strcat("expected ',' or ']' in the array: ", s));
      }
      if (i >= s.size()) error("an array must end on its line with ']'");
      ++i;
    } else {
      e.values.push_back(scalar(&e.kind));
    }
    e.text = s.substr(start, i - start);
  }
};

void parse_section(LineReader& r, ConfigFile& cf, int line) {
  ++r.i;
  if (r.i < r.s.size() && r.s[r.i] == '[') r.error("arrays of tables ([[...]]) are not supported; expected [command]");
  r.skip_space();
  const std::string name = r.name("a section name");
  r.skip_space();
  if (r.i < r.s.size() && r.s[r.i] == '.')
    r.error(strcat("nested sections are not supported; expected [command], e.g. [train]"));
  if (r.i >= r.s.size() || r.s[r.i] != ']') r.error("expected ']' after the section name");
  ++r.i;
  for (const auto& sec : cf.sections)
    if (sec.name == name) r.error(strcat("section [", name, "] given twice (first on line ", sec.line, ")"));
  cf.sections.push_back({name, line});
}

void parse_entry(LineReader& r, ConfigFile& cf, int line) {
  ConfigEntry e;
  e.section = cf.sections.empty() ? "" : cf.sections.back().name;
  e.line = line;
  e.key = r.name("a key (key = value) or a [section]");
  r.skip_space();
  if (r.i >= r.s.size() || r.s[r.i] != '=') r.error(strcat("expected '=' after ", e.key));
  ++r.i;
  r.skip_space();
  const std::string at = r.at;
  r.at += e.key + " = ";  // value errors name the key
  r.value(e);
  r.at = at;
  for (const auto& other : cf.entries)
    if (other.section == e.section && config_key_to_option(other.key) == config_key_to_option(e.key))
      r.error(strcat(e.key, " given twice", e.section.empty() ? "" : " in [" + e.section + "]", " (first on line ",
                     other.line, ")"));
  cf.entries.push_back(std::move(e));
}

}  // namespace

std::string config_key_to_option(const std::string& key) {
  std::string k = key;
  for (char& c : k)
    if (c == '_') c = '-';
  return k;
}

ConfigFile parse_config_text(const std::string& text, const std::string& origin) {
  ConfigFile cf;
  cf.path = origin;
  std::istringstream in(text);
  std::string s;
  for (int line = 1; std::getline(in, s); ++line) {
    if (!s.empty() && s.back() == '\r') s.pop_back();
    LineReader r{s, 0, strcat(origin, ":", line, ": ")};
    r.skip_space();
    if (r.done()) continue;
    if (s[r.i] == '[')
      parse_section(r, cf, line);
    else
      parse_entry(r, cf, line);
    r.skip_space();
    if (!r.done()) r.error(strcat("unexpected text after the value: ", s.substr(r.i)));
  }
  return cf;
}

ConfigFile read_config_file(const std::string& path) {
  if (!file_exists(path)) fail(strcat(path, ": config file not found (--config)"));
  refuse_special_file(path, "config file (--config)");
  return parse_config_text(read_file_bytes(path), path);
}

std::string config_path_in_args(int argc, const char* const* argv) {
  const std::string flag = "--config";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag && i + 1 < argc) return argv[i + 1];
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

std::string ConfigReader::to_config(const CLI::App* app, bool default_also, bool write_description,
                                    std::string prefix) const {
  return CLI::ConfigTOML().to_config(app, default_also, write_description, std::move(prefix));
}

std::vector<CLI::ConfigItem> ConfigReader::from_config(std::istream& input) const {
  std::stringstream text;
  text << input.rdbuf();
  std::vector<CLI::ConfigItem> items;
  for (const ConfigEntry& e : parse_config_text(text.str(), "--config").entries) {
    CLI::ConfigItem item;
    if (!e.section.empty()) item.parents = {e.section};
    item.name = config_key_to_option(e.key);
    item.inputs = e.values;
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace lt::cli
