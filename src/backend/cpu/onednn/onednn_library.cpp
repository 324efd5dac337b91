// Loading oneDNN with dlopen (onednn_library.h); compiled only with oneDNN's headers.
#if LLAMATRAIN_HAVE_ONEDNN
#include "backend/cpu/onednn/onednn_library.h"

#include <memory>

#include "runtime/dynamic_library.h"
#include "llamatrain/error.h"

namespace lt::cpu::onednn {
namespace {

std::unique_ptr<Library> load(std::string* why) {
  std::string tried;
  void* lib = dynlib::open_first({"libdnnl.so.2", "libdnnl.so"}, &tried);
  if (!lib) {
    *why = "oneDNN (libdnnl.so.2) could not be loaded; install it with scripts/install-deps.sh "
           "(Debian: libdnnl-dev)" + tried;
    return nullptr;
  }
  auto L = std::make_unique<Library>();
  const char* name = "oneDNN";
  try {
    dynlib::load_symbol(lib, L->engine_create, "dnnl_engine_create", name);
    dynlib::load_symbol(lib, L->stream_create, "dnnl_stream_create", name);
    dynlib::load_symbol(lib, L->stream_wait, "dnnl_stream_wait", name);
    dynlib::load_symbol(lib, L->memory_desc_init_by_strides, "dnnl_memory_desc_init_by_strides", name);
    dynlib::load_symbol(lib, L->memory_desc_init_by_tag, "dnnl_memory_desc_init_by_tag", name);
    dynlib::load_symbol(lib, L->memory_desc_get_size, "dnnl_memory_desc_get_size", name);
    dynlib::load_symbol(lib, L->memory_create, "dnnl_memory_create", name);
    dynlib::load_symbol(lib, L->memory_set_data_handle, "dnnl_memory_set_data_handle", name);
    dynlib::load_symbol(lib, L->matmul_desc_init, "dnnl_matmul_desc_init", name);
    dynlib::load_symbol(lib, L->primitive_attr_create, "dnnl_primitive_attr_create", name);
    dynlib::load_symbol(lib, L->primitive_attr_destroy, "dnnl_primitive_attr_destroy", name);
    dynlib::load_symbol(lib, L->primitive_attr_set_post_ops, "dnnl_primitive_attr_set_post_ops", name);
    dynlib::load_symbol(lib, L->post_ops_create, "dnnl_post_ops_create", name);
    dynlib::load_symbol(lib, L->post_ops_destroy, "dnnl_post_ops_destroy", name);
    dynlib::load_symbol(lib, L->post_ops_append_sum, "dnnl_post_ops_append_sum", name);
    dynlib::load_symbol(lib, L->primitive_desc_create, "dnnl_primitive_desc_create", name);
    dynlib::load_symbol(lib, L->primitive_desc_destroy, "dnnl_primitive_desc_destroy", name);
    dynlib::load_symbol(lib, L->primitive_desc_query, "dnnl_primitive_desc_query", name);
    dynlib::load_symbol(lib, L->primitive_desc_query_md, "dnnl_primitive_desc_query_md", name);
    dynlib::load_symbol(lib, L->reorder_primitive_desc_create, "dnnl_reorder_primitive_desc_create", name);
    dynlib::load_symbol(lib, L->primitive_create, "dnnl_primitive_create", name);
    dynlib::load_symbol(lib, L->primitive_execute, "dnnl_primitive_execute", name);
    dynlib::load_symbol(lib, L->get_effective_cpu_isa, "dnnl_get_effective_cpu_isa", name);
    dynlib::load_symbol(lib, L->version, "dnnl_version", name);
    dynlib::load_symbol(lib, L->sgemm, "dnnl_sgemm", name);
  } catch (const Error& e) {
    *why = strcat(e.what(), " (", dynlib::loaded_path(lib), "; llamatrain needs oneDNN 2.x)");
    return nullptr;
  }
  L->path = dynlib::loaded_path(lib);
  if (L->version()->major != DNNL_VERSION_MAJOR) {
    *why = strcat(L->path, " is oneDNN ", L->version()->major, ".", L->version()->minor,
                  "; llamatrain was built against oneDNN ", DNNL_VERSION_MAJOR, ".x headers");
    return nullptr;
  }
  return L;
}

struct Loaded {
  std::unique_ptr<Library> lib;
  std::string why;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    r.lib = load(&r.why);
    return r;
  }();
  return l;
}

}  // namespace

const Library& library() {
  if (!loaded().lib) fail(loaded().why);
  return *loaded().lib;
}

bool library_available(std::string* why) {
  if (!loaded().lib && why) *why = loaded().why;
  return loaded().lib != nullptr;
}

void check(dnnl_status_t status, const char* what) {
  if (status == dnnl_success) return;
  const char* names[] = {"success", "out of memory", "invalid arguments", "unimplemented",
                         "iterator ends", "runtime error", "not required"};
  const int s = int(status);
  fail(strcat("oneDNN ", what, ": ", s >= 0 && s < 7 ? names[s] : "unknown status", " (", s, ")"));
}

}  // namespace lt::cpu::onednn
#endif
