// The GPU libraries the CUDA backend opens with dlopen on first use instead of linking them
// (cuBLASLt in device_gpu.cu, NCCL in device_comm_gpu.cu, cuDNN in cudnn_attention.cu): a CPU run
// never maps them, and a binary built on the development machine finds them on a GPU machine
// wherever they are installed. Each caller lists its candidates and says what needs the library.
#pragma once
#include <dlfcn.h>
#include <link.h>

#include <string>
#include <type_traits>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/gpu_presence.h"

namespace lt::dynlib {

// The first of `candidates` (paths or sonames; empty ones skipped, each tried once) that dlopen
// accepts, or null with `tried` listing every failure, one "\n  <dlerror()>" line each (dlerror
// names the file and the reason).
inline void* open_first(const std::vector<std::string>& candidates, std::string* tried) {
  std::vector<std::string> seen;
  for (const std::string& name : candidates) {
    if (name.empty()) continue;
    bool again = false;
    for (const std::string& s : seen) again = again || s == name;
    if (again) continue;
    seen.push_back(name);
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* why = dlerror();
    *tried += strcat("\n  ", why ? std::string(why) : name + ": not loadable");
  }
  return nullptr;
}

// `candidates` followed by <dir>/<file> for each library directory of the NVIDIA Python wheels
// `packages` (PyTorch's CUDA wheels bring cuDNN, NCCL and cuBLAS there: site-packages/nvidia/*/lib).
inline std::vector<std::string> with_python_wheels(std::vector<std::string> candidates,
                                                   const std::vector<std::string>& packages, const std::string& file) {
  for (const std::string& package : packages)
    for (const std::string& dir : python_wheel_library_dirs(package)) candidates.push_back(dir + "/" + file);
  return candidates;
}

// The file a handle from dlopen was loaded from ("" if unknown).
inline std::string loaded_path(void* lib) {
  link_map* map = nullptr;
  if (lib == nullptr || dlinfo(lib, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) return "";
  return map->l_name;
}

// "path" of the first candidate that loads, or "not found (tried: ...)", for `llamatrain info`.
inline std::string describe_first(const std::vector<std::string>& candidates) {
  std::string tried;
  void* lib = open_first(candidates, &tried);
  if (lib == nullptr) return "not found" + tried;
  const std::string path = loaded_path(lib);
  return path.empty() ? std::string("loaded") : path;
}

// fn = the symbol `name` of lib; throws lt::Error naming the library and the symbol if it is absent.
template <class Fn>
void load_symbol(void* lib, Fn& fn, const char* name, const char* library) {
  fn = reinterpret_cast<std::remove_reference_t<Fn>>(dlsym(lib, name));
  if (!fn) fail(strcat(library, ": ", name, " not found in the loaded library"));
}

}  // namespace lt::dynlib
