#include "cli/config_file.h"

#include <cctype>
#include <cstdint>
#include <map>
#include <sstream>
#include <unordered_map>

#include "cli/ranges.h"
#include "cli/suggest.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt::cli {

namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// A bare word meant as a number: a digit first, or a sign, '.' or '_' and then a digit.
bool looks_numeric(const std::string& w) {
  const size_t i = !w.empty() && (w[0] == '+' || w[0] == '-') ? 1 : 0;
  if (i < w.size() && is_digit(w[i])) return true;
  return i + 1 < w.size() && (w[i] == '.' || w[i] == '_') && is_digit(w[i + 1]);
}

// No number: *why says what TOML forbids in it.
std::string refuse(std::string* why, std::string what) {
  *why = std::move(what);
  return "";
}

// 0x, 0o or 0b and its digits (w[sign] is the '0'), in decimal.
std::string based_integer(const std::string& w, size_t sign, std::string* why) {
  const char prefix = w[sign + 1];
  const unsigned base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : 2;
  const std::string digits = w.substr(sign + 2);
  if (base == 16 && digits.find_first_of(".pP") != std::string::npos)
    return refuse(why, "hexadecimal floats are not allowed; 0x, 0o and 0b are for integers");
  if (sign) return refuse(why, "0x, 0o and 0b integers take no sign");
  uint64_t v = 0;
  size_t n = 0;
  for (size_t k = 0; k < digits.size(); ++k) {
    const char c = digits[k];
    if (c == '_') {
      if (k == 0 || k + 1 == digits.size() || digits[k - 1] == '_' || digits[k + 1] == '_')
        return refuse(why, "an underscore must sit between two digits");
      continue;
    }
    const unsigned d = is_digit(c) ? unsigned(c - '0')
                       : std::isxdigit(static_cast<unsigned char>(c)) ? unsigned(std::tolower(c) - 'a' + 10)
                                                                      : 99;
    if (d >= base) return refuse(why, strcat("'", c, "' is not a digit in base ", base));
    if (v > (UINT64_MAX - d) / base) return refuse(why, "above the largest 64-bit integer");
    v = v * base + d;
    ++n;
  }
  if (n == 0) return refuse(why, strcat("no digits after 0", prefix));
  return std::to_string(v);
}

// A TOML 1.0 integer or float (toml.io/en/v1.0.0) as the text the option parses: decimal with the
// underscores dropped, 0x/0o/0b integers in decimal, [+-]inf and [+-]nan as written (the option's
// range refuses them). Else "", with *why saying what TOML forbids in it (leading zeros, an
// underscore not between digits, a hexadecimal float, ...) or left empty for a word that is no
// number at all. One pass over the word.
std::string toml_number(const std::string& w, std::string* why) {
  const size_t sign = !w.empty() && (w[0] == '+' || w[0] == '-') ? 1 : 0;
  const std::string body = w.substr(sign);
  if (body == "inf" || body == "nan") return w;
  if (!looks_numeric(w)) return "";
  if (body.size() > 1 && body[0] == '0' && (body[1] == 'x' || body[1] == 'o' || body[1] == 'b'))
    return based_integer(w, sign, why);
  for (size_t k = 0; k < w.size(); ++k)
    if (w[k] == '_' && (k == 0 || k + 1 == w.size() || !is_digit(w[k - 1]) || !is_digit(w[k + 1])))
      return refuse(why, "an underscore must sit between two digits");
  std::string out = w.substr(0, sign);
  size_t i = sign;
  auto digits = [&] {  // DIGIT *( [_] DIGIT ), the underscores dropped; the number of digits
    size_t n = 0;
    for (; i < w.size() && (is_digit(w[i]) || w[i] == '_'); ++i)
      if (w[i] != '_') out += w[i], ++n;
    return n;
  };
  const size_t int_digits = digits();
  if (int_digits > 1 && w[sign] == '0') return refuse(why, "leading zeros are not allowed");
  if (i < w.size() && w[i] == '.') {
    out += w[i++];
    if (int_digits == 0 || digits() == 0) return refuse(why, "a decimal point needs a digit on each side");
  }
  if (int_digits == 0) return "";
  if (i < w.size() && (w[i] == 'e' || w[i] == 'E')) {
    out += w[i++];
    if (i < w.size() && (w[i] == '+' || w[i] == '-')) out += w[i++];
    if (digits() == 0) return refuse(why, "an exponent needs digits");
  }
  return i == w.size() ? out : "";
}

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

  // A bare scalar: true, false or a TOML number (toml_number).
  std::string bare(ConfigValueKind* kind) {
    const size_t start = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i])) && s[i] != ',' && s[i] != ']' && s[i] != '#')
      ++i;
    const std::string word = s.substr(start, i - start);
    if (word == "true" || word == "false") {
      *kind = ConfigValueKind::boolean;
      return word;
    }
    std::string why;
    const std::string number = toml_number(word, &why);
    if (!why.empty()) error(strcat(word, ": not a TOML number (", why, ")"));
    if (number.empty())
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

// The line of each section, and of each key by section and option name: a repeat is found in
// constant time, so a file of many keys reads in linear time.
struct FirstLines {
  std::unordered_map<std::string, int> sections, keys;
};

void parse_section(LineReader& r, ConfigFile& cf, FirstLines& seen, int line) {
  ++r.i;
  if (r.i < r.s.size() && r.s[r.i] == '[') r.error("arrays of tables ([[...]]) are not supported; expected [command]");
  r.skip_space();
  const std::string name = r.name("a section name");
  r.skip_space();
  if (r.i < r.s.size() && r.s[r.i] == '.')
    r.error(strcat("nested sections are not supported; expected [command], e.g. [train]"));
  if (r.i >= r.s.size() || r.s[r.i] != ']') r.error("expected ']' after the section name");
  ++r.i;
  const auto [first, fresh] = seen.sections.emplace(name, line);
  if (!fresh) r.error(strcat("section [", name, "] given twice (first on line ", first->second, ")"));
  cf.sections.push_back({name, line});
}

void parse_entry(LineReader& r, ConfigFile& cf, FirstLines& seen, int line) {
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
  const auto [first, fresh] = seen.keys.emplace(e.section + '\n' + config_key_to_option(e.key), line);
  if (!fresh)
    r.error(strcat(e.key, " given twice", e.section.empty() ? "" : " in [" + e.section + "]", " (first on line ",
                   first->second, ")"));
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
  FirstLines seen;
  std::istringstream in(text);
  std::string s;
  for (int line = 1; std::getline(in, s); ++line) {
    if (!s.empty() && s.back() == '\r') s.pop_back();
    LineReader r{s, 0, strcat(origin, ":", line, ": ")};
    r.skip_space();
    if (r.done()) continue;
    if (s[r.i] == '[')
      parse_section(r, cf, seen, line);
    else
      parse_entry(r, cf, seen, line);
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
