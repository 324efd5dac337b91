// Hostfile parser. The grammar is the subset of Open MPI's hostfile
// syntax (orte/util/hostfile, `man orte_hosts`) that our hostfiles use, plus the annotation in
// the trailing comment; see hostfile.h. Errors name the line and say what was expected.
#include "llamatrain/hostfile.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt {
namespace {

// A line of a hostfile with more slots than this is a typo, not a node.
constexpr long kMaxSlots = 1 << 20;


std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) words.push_back(s.substr(i, j - i));
    i = j;
  }
  return words;
}

// Digits only (no sign, no spaces), 1..kMaxSlots.
bool parse_positive_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 8) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  const long v = std::strtol(s.c_str(), nullptr, 10);
  if (v <= 0 || v > kMaxSlots) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_positive_number(const std::string& s, double* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0) return false;
  *out = v;
  return true;
}

// Host names as Open MPI's lexer takes them: a name or address, optionally user@ in front.
bool valid_host_name(const std::string& h) {
  if (h.empty() || !std::isalnum(static_cast<unsigned char>(h[0]))) return false;
  for (char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' && c != '@' && c != ':')
      return false;
  return true;
}

// Open MPI spellings of slots= and max_slots= that we decline, so that every hostfile of the
// project reads the same; the message names the spelling to use instead.
bool is_slots_alias(const std::string& key) { return key == "count" || key == "cpu"; }
bool is_max_slots_alias(const std::string& key) {
  for (const char* a : {"max-slots", "slots-max", "slots_max", "cpu-max", "cpu_max", "max-cpu", "max_cpu",
                        "count-max", "count_max", "max-count", "max_count"})
    if (key == a) return true;
  return false;
}

// A word of the annotation and its 1-based column in the line; a value in quotes (gpu="NVIDIA H100
// PCIe") is one word, its quotes removed.
struct AnnotationWord {
  std::string text;
  size_t column = 0;
  bool quoted = false;
};

std::vector<AnnotationWord> annotation_words(const std::string& text, size_t first_column, const std::string& at) {
  std::vector<AnnotationWord> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i >= text.size()) break;
    AnnotationWord w;
    w.column = first_column + i;
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) {
      const char c = text[i];
      if ((c == '"' || c == '\'') && i > 0 && text[i - 1] == '=') {
        const size_t close = text.find(c, i + 1);
        if (close == std::string::npos)
          fail(strcat(at, w.column, ": ", text.substr(w.column - first_column), ": the quote is not closed"));
        w.text += text.substr(i + 1, close - i - 1);
        w.quoted = true;
        i = close + 1;
        continue;
      }
      w.text += c;
      ++i;
    }
    words.push_back(std::move(w));
  }
  return words;
}

// The annotation in the trailing comment of a host line (hostfile.h): key=value words up to a
// second '#', after which the text is free. A comment without any '=' is free text. gpu= takes
// the name in quotes, or the words up to the next key=value, so nvidia-smi's names ("NVIDIA H100
// PCIe") read whole; any other word is refused with its line and column.
void parse_annotation(const std::string& line, size_t hash, const std::string& origin, int line_no, HostEntry& e) {
  std::string text = line.substr(hash + 1);
  text = text.substr(0, text.find('#'));
  if (text.find('=') == std::string::npos) return;
  const std::string at = strcat(origin, ":", line_no, ":");
  const std::vector<AnnotationWord> words = annotation_words(text, hash + 2, at);
  bool have_gpus = false, have_nic = false;
  size_t gpus_column = 0, threads_column = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    const AnnotationWord& w = words[i];
    const std::string& word = w.text;
    const size_t eq = word.find('=');
    const std::string at_word = strcat(at, w.column, ": ");
    if (eq == std::string::npos || eq == 0)
      fail(strcat(at_word, word, ": unknown word in the annotation; expected gpu=<type>, gpus=<count>, "
                  "nic_gbps=<Gb/s> or threads=<count> (free text goes after a second '#')"));
    const std::string key = word.substr(0, eq);
    std::string value = word.substr(eq + 1);
    if (key == "gpu") {
      std::string written = word;
      if (!w.quoted)
        while (i + 1 < words.size() && words[i + 1].text.find('=') == std::string::npos) {
          value += " " + words[++i].text;
          written += " " + words[i].text;
        }
      if (!e.gpu.empty()) fail(strcat(at_word, written, ": gpu= given twice; expected one gpu=<type> per host"));
      if (value.empty()) fail(strcat(at_word, written, ": expected a GPU type, e.g. gpu=A100-SXM4-80GB"));
      // Every reader of the inventory (info, plan) then sees the table's name for the type.
      e.gpu = require_gpu_spec(value, strcat(at_word, written)).name;
      e.gpu_note = gpu_alias_note(value);
    } else if (key == "gpus") {
      if (have_gpus) fail(strcat(at_word, word, ": gpus= given twice; expected one gpus=<count> per host"));
      if (!parse_positive_int(value, &e.gpus)) fail(strcat(at_word, word, ": expected a positive integer"));
      have_gpus = true;
      gpus_column = w.column;
    } else if (key == "nic_gbps") {
      if (have_nic) fail(strcat(at_word, word, ": nic_gbps= given twice; expected one per host"));
      if (!parse_positive_number(value, &e.nic_gbps))
        fail(strcat(at_word, word, ": expected a positive number (Gb/s of the node's network)"));
      have_nic = true;
    } else if (key == "threads") {
      if (e.threads > 0) fail(strcat(at_word, word, ": threads= given twice; expected one per host"));
      if (!parse_positive_int(value, &e.threads))
        fail(strcat(at_word, word, ": expected a positive integer (OpenMP threads per rank)"));
      threads_column = w.column;
    } else {
      fail(strcat(at_word, word, ": unknown annotation key '", key,
                  "'; expected gpu=<type>, gpus=<count>, nic_gbps=<Gb/s> or threads=<count> after '#'"));
    }
  }
  if (have_gpus && e.gpu.empty())
    fail(strcat(at, gpus_column, ": gpus=", e.gpus, ": expected gpu=<type> too (which GPUs?)"));
  // The planner times a GPU rank by its GPU; the host threads of a CPU rank set its rate.
  if (e.threads > 0 && !e.gpu.empty())
    fail(strcat(at, threads_column, ": threads=", e.threads, ": expected no gpu= beside it (threads= describes "
                "the ranks of a CPU node)"));
  // One rank per GPU is the layout we launch, so the GPU count defaults to the slots.
  if (!e.gpu.empty() && !have_gpus) e.gpus = e.slots;
}

}  // namespace

int Hostfile::total_slots() const {
  int n = 0;
  for (const auto& h : hosts) n += h.slots;
  return n;
}

std::vector<std::string> Hostfile::gpu_notes() const {
  std::vector<std::string> notes;
  for (const auto& h : hosts)
    if (!h.gpu_note.empty()) notes.push_back(strcat(path, ":", h.line, ": ", h.gpu_note));
  return notes;
}

Hostfile parse_hostfile_text(const std::string& text, const std::string& origin) {
  Hostfile hf;
  hf.path = origin;
  std::map<std::string, int> seen;  // lower-case host name -> line (DNS names are case-insensitive)
  size_t pos = 0;
  for (int line_no = 1; pos < text.size(); ++line_no) {
    size_t eol = text.find('\n', pos);
    const bool has_newline = eol != std::string::npos;
    if (!has_newline) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string at = strcat(origin, ":", line_no, ": ");

    const size_t hash = line.find('#');
    // Open MPI's lexer matches a comment as "#.*\n", so a comment that ends the file without a
    // newline is a parse error for mpirun (checked with Open MPI 4.1).
    if (hash != std::string::npos && !has_newline)
      fail(strcat(at, "the file ends inside a comment; expected a newline at the end (mpirun rejects it)"));
    const std::vector<std::string> words = split_words(line.substr(0, hash));
    if (words.empty()) continue;  // blank, or only a comment

    HostEntry e;
    e.line = line_no;
    e.host = words[0];
    if (e.host.find('=') != std::string::npos)
      fail(strcat(at, e.host, ": expected a host name first, then slots=N"));
    if (!valid_host_name(e.host))
      fail(strcat(at, e.host, ": expected a host name (letters, digits, '.', '-', '_', optionally user@)"));

    bool have_slots = false, have_max = false;
    for (size_t i = 1; i < words.size(); ++i) {
      const std::string& word = words[i];
      const size_t eq = word.find('=');
      if (eq == std::string::npos || eq == 0)
        fail(strcat(at, word, ": expected slots=N or max_slots=M (key=value, no spaces)"));
      const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
      if (key == "slots") {
        if (have_slots) fail(strcat(at, word, ": slots= given twice; expected one per host"));
        if (!parse_positive_int(value, &e.slots)) fail(strcat(at, word, ": expected a positive integer"));
        have_slots = true;
      } else if (key == "max_slots") {
        if (have_max) fail(strcat(at, word, ": max_slots= given twice; expected one per host"));
        if (!parse_positive_int(value, &e.max_slots)) fail(strcat(at, word, ": expected a positive integer"));
        have_max = true;
      } else if (is_slots_alias(key)) {
        fail(strcat(at, word, ": expected slots=", value, " (", key, "= is an Open MPI alias we do not use)"));
      } else if (is_max_slots_alias(key)) {
        fail(strcat(at, word, ": expected max_slots=", value, " (", key, "= is an Open MPI alias we do not use)"));
      } else {
        fail(strcat(at, word, ": unknown key '", key, "'; expected slots=N or max_slots=M"));
      }
    }
    if (have_max && e.max_slots < e.slots)
      fail(strcat(at, "max_slots=", e.max_slots, ": expected at least slots=", e.slots));
    if (hash != std::string::npos) parse_annotation(line, hash, origin, line_no, e);

    const auto [it, inserted] = seen.emplace(ascii_lower(e.host), line_no);
    if (!inserted)
      fail(strcat(at, e.host, ": host already listed on line ", it->second, "; expected one line per host"));
    hf.hosts.push_back(std::move(e));
  }
  if (hf.hosts.empty())
    fail(strcat(origin, ": no hosts; expected at least one line `HOST slots=N` (the file is empty or only comments)"));
  return hf;
}

Hostfile read_hostfile(const std::string& path) { return parse_hostfile_text(read_file_bytes(path), path); }

}  // namespace lt
