// Hostfile parser and the GPU spec table. The grammar is the subset of Open MPI's hostfile
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

// The annotation in the trailing comment of a host line; words without '=' are free text.
void parse_annotation(const std::string& comment, const std::string& at, HostEntry& e) {
  bool have_gpus = false, have_nic = false;
  for (const std::string& word : split_words(comment)) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    if (key == "gpu") {
      if (!e.gpu.empty()) fail(strcat(at, word, ": gpu= given twice; expected one gpu=<type> per host"));
      if (value.empty()) fail(strcat(at, word, ": expected a GPU type, e.g. gpu=A100-SXM4-80GB"));
      // Every reader of the inventory (info, plan) then sees the table's name for the type.
      e.gpu = require_gpu_spec(value, strcat(at, word)).name;
    } else if (key == "gpus") {
      if (have_gpus) fail(strcat(at, word, ": gpus= given twice; expected one gpus=<count> per host"));
      if (!parse_positive_int(value, &e.gpus)) fail(strcat(at, word, ": expected a positive integer"));
      have_gpus = true;
    } else if (key == "nic_gbps") {
      if (have_nic) fail(strcat(at, word, ": nic_gbps= given twice; expected one per host"));
      if (!parse_positive_number(value, &e.nic_gbps))
        fail(strcat(at, word, ": expected a positive number (Gb/s of the node's network)"));
      have_nic = true;
    } else {
      fail(strcat(at, word, ": unknown annotation key '", key,
                  "'; expected gpu=<type>, gpus=<count> or nic_gbps=<Gb/s> after '#'"));
    }
  }
  if (have_gpus && e.gpu.empty())
    fail(strcat(at, "gpus=", e.gpus, ": expected gpu=<type> too (which GPUs?)"));
  // One rank per GPU is the layout we launch, so the GPU count defaults to the slots.
  if (!e.gpu.empty() && !have_gpus) e.gpus = e.slots;
}

}  // namespace

int Hostfile::total_slots() const {
  int n = 0;
  for (const auto& h : hosts) n += h.slots;
  return n;
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
    if (hash != std::string::npos) parse_annotation(line.substr(hash + 1), at, e);

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

const std::vector<GpuSpec>& gpu_specs() {
  // NVIDIA datasheets, dense bf16 tensor-core peak (the datasheets' headline figures with
  // structured sparsity are twice these), memory bandwidth and capacity as printed (GB).
  static const std::vector<GpuSpec> specs = {
      {"A100-SXM4-80GB", 312, 2039, 80},   // A100 datasheet (2021), SXM 80GB column
      {"A100-SXM4-40GB", 312, 1555, 40},   // A100 datasheet, SXM 40GB
      {"A100-PCIe-80GB", 312, 1935, 80},   // A100 datasheet, PCIe 80GB
      {"A100-PCIe-40GB", 312, 1555, 40},   // A100 datasheet, PCIe 40GB
      {"H100-SXM5-80GB", 989, 3350, 80},   // H100 datasheet, SXM (1979 with sparsity)
      {"H100-PCIe-80GB", 756, 2000, 80},   // H100 PCIe product brief (1513 with sparsity)
      {"H100-NVL-94GB", 835, 3900, 94},    // H100 datasheet, NVL (1671 with sparsity)
      {"H200", 989, 4800, 141},            // H200 datasheet, SXM (same compute as H100 SXM)
  };
  return specs;
}

namespace {

// Other names of the table's types: what Slurm GRES and people write (a100, H100-PCIe) and what
// the CUDA driver reports ("NVIDIA H100 80GB HBM3"), after gpu_key(). A name without the form
// factor or memory is the SXM part with the most memory (A100: SXM4 80GB, the usual cluster part);
// `info --hostfile` prints the type it resolved to.
struct GpuAliases {
  const char* type;
  std::vector<const char*> names;
};
const std::vector<GpuAliases>& gpu_aliases() {
  static const std::vector<GpuAliases> aliases = {
      {"A100-SXM4-80GB", {"a100", "a100-80gb", "a100-sxm4", "a100-sxm", "a100-sxm-80gb"}},
      {"A100-SXM4-40GB", {"a100-40gb", "a100-sxm-40gb"}},
      {"A100-PCIe-80GB", {"a100-pcie", "a100-80gb-pcie"}},
      {"A100-PCIe-40GB", {"a100-40gb-pcie"}},
      {"H100-SXM5-80GB", {"h100", "h100-80gb", "h100-sxm", "h100-sxm5", "h100-sxm-80gb", "h100-80gb-hbm3"}},
      {"H100-PCIe-80GB", {"h100-pcie", "h100-80gb-pcie"}},
      {"H100-NVL-94GB", {"h100-nvl"}},
      {"H200", {"h200-141gb", "h200-sxm", "h200-sxm-141gb"}},
  };
  return aliases;
}

// Case, the driver's "NVIDIA " prefix, and ' ' or '_' for '-' do not matter.
std::string gpu_key(const std::string& name) {
  std::string k = ascii_lower(name);
  if (k.rfind("nvidia", 0) == 0) k = k.substr(6);
  while (!k.empty() && (k[0] == ' ' || k[0] == '-' || k[0] == '_')) k = k.substr(1);
  for (char& c : k)
    if (c == ' ' || c == '_') c = '-';
  return k;
}

}  // namespace

const GpuSpec* gpu_spec_for_device(const std::string& device_name, double memory_bytes) {
  // The one name table first (it knows the names the driver reports); then, for a name it lacks,
  // the family from the name and the part from the memory.
  if (const GpuSpec* s = find_gpu_spec(device_name)) return s;
  const std::string n = ascii_lower(device_name);
  const auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  const bool big = memory_bytes >= 60.0 * double(1ull << 30);  // the 80 GB parts (40 GB otherwise)
  if (has("h200")) return find_gpu_spec("H200");
  if (has("h100")) return find_gpu_spec(has("nvl") ? "H100-NVL-94GB" : has("pcie") ? "H100-PCIe-80GB" : "H100-SXM5-80GB");
  if (has("a100"))
    return find_gpu_spec(has("pcie") ? (big ? "A100-PCIe-80GB" : "A100-PCIe-40GB") : (big ? "A100-SXM4-80GB" : "A100-SXM4-40GB"));
  return nullptr;
}

const GpuSpec* find_gpu_spec(const std::string& name) {
  const std::string key = gpu_key(name);
  if (key.empty()) return nullptr;
  std::string canonical = key;
  for (const auto& a : gpu_aliases())
    for (const char* alias : a.names)
      if (key == alias) canonical = ascii_lower(a.type);
  for (const auto& s : gpu_specs())
    if (ascii_lower(s.name) == canonical) return &s;
  return nullptr;
}

std::string known_gpu_names() {
  std::string known;
  for (const auto& s : gpu_specs()) known += (known.empty() ? "" : ", ") + s.name;
  return known + " (or a100, a100-40gb, a100-pcie, h100, h100-pcie, h100-nvl, h200, the names nvidia-smi prints)";
}

const GpuSpec& require_gpu_spec(const std::string& name, const std::string& where) {
  const GpuSpec* s = find_gpu_spec(name);
  if (!s) fail(strcat(where, ": unknown GPU type '", name, "'; known types: ", known_gpu_names()));
  return *s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace lt
