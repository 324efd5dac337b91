// The GPU spec table and its name lookup (gpu_spec.h).
#include "llamatrain/gpu_spec.h"

#include <cctype>

#include "llamatrain/error.h"

namespace lt {

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

std::string gpu_alias_note(const std::string& name) {
  const GpuSpec* spec = find_gpu_spec(name);
  if (!spec) return "";
  const std::string k = gpu_key(name);
  const auto has = [&](const char* t) { return k.find(t) != std::string::npos; };
  const bool form = has("sxm") || has("pcie") || has("nvl") || has("hbm");
  const bool memory = has("40gb") || has("80gb") || has("94gb");
  // An H100's form factor fixes its memory; an A100 comes in both sizes of both forms.
  const std::string family = has("a100") ? "a100" : has("h100") ? "h100" : "";
  const bool ambiguous = family == "a100" ? !form || !memory : family == "h100" ? !form : false;
  if (!ambiguous) return "";
  std::string others;
  for (const auto& s : gpu_specs())
    if (&s != spec && ascii_lower(s.name).rfind(family, 0) == 0) others += (others.empty() ? "" : " or ") + s.name;
  return strcat("gpu=", name, " read as ", spec->name, " (", spec->bf16_tflops, " TFLOP/s dense bf16, ",
                spec->memory_gib, " GB); for ", others, " write that name or the one nvidia-smi prints");
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
