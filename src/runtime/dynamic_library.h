// The libraries opened with dlopen on first use instead of linked (cuBLASLt in device_gpu.cu, NCCL
// in device_comm_gpu.cu, cuDNN in cudnn_attention.cu, oneDNN in onednn_library.cpp): a run that
// does not use one never maps it, and a binary built on the development machine finds them on a GPU machine
// wherever they are installed. Each caller lists its candidates and says what needs the library.
#pragma once
#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <string>
#include <type_traits>
#include <vector>

#include "llamatrain/error.h"

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

// The paths matching a glob(3) pattern.
inline std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  return out;
}

// Library directories of an NVIDIA Python wheel ("cudnn", "nccl", "cublas": .../site-packages/nvidia/
// <package>/lib) in the Python environments a GPU machine usually has: $VIRTUAL_ENV, $CONDA_PREFIX,
// each $PYTHONPATH entry, ~/.local, /usr/local and /usr (python3.*, site- or dist-packages), those
// that exist, in that order.
inline std::vector<std::string> python_wheel_library_dirs(const std::string& package) {
  std::vector<std::string> prefixes;
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* v = std::getenv(var); v && *v) prefixes.push_back(v);
  std::vector<std::string> site_dirs;
  if (const char* pp = std::getenv("PYTHONPATH"); pp && *pp) {
    std::stringstream in(pp);
    for (std::string d; std::getline(in, d, ':');)
      if (!d.empty()) site_dirs.push_back(d);
  }
  if (const char* home = std::getenv("HOME"); home && *home) prefixes.push_back(std::string(home) + "/.local");
  prefixes.push_back("/usr/local");
  prefixes.push_back("/usr");
  for (const std::string& prefix : prefixes)
    for (const char* kind : {"site-packages", "dist-packages"})
      for (const std::string& d : glob_paths(prefix + "/lib/python3*/" + kind)) site_dirs.push_back(d);
  site_dirs.push_back("/usr/lib/python3/dist-packages");
  std::vector<std::string> out;
  for (const std::string& site : site_dirs) {
    const std::string lib = site + "/nvidia/" + package + "/lib";
    if (glob_paths(lib).empty() || std::find(out.begin(), out.end(), lib) != out.end()) continue;
    out.push_back(lib);
  }
  return out;
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
