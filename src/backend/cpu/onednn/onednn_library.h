// oneDNN's C API (Debian 12: libdnnl2, oneDNN 2.x), opened with dlopen on first use instead of
// linked: the 40 MB library is mapped only by a run that asks for bf16 on the CPU, and the GPU
// check's bundle of llamatrain's shared libraries (64 MiB at most) does not carry it. Only the
// headers (libdnnl-dev) are needed at build time; the function types come from them.
#pragma once
#include <string>

#include "dnnl.h"

#if DNNL_VERSION_MAJOR != 2
#error "llamatrain's bf16 CPU path uses oneDNN 2.x's C API (Debian 12's libdnnl-dev 2.6)"
#endif

namespace lt::cpu::onednn {

// The functions llamatrain calls, each loaded by name.
struct Library {
  decltype(&::dnnl_engine_create) engine_create;
  decltype(&::dnnl_stream_create) stream_create;
  decltype(&::dnnl_stream_wait) stream_wait;
  decltype(&::dnnl_memory_desc_init_by_strides) memory_desc_init_by_strides;
  decltype(&::dnnl_memory_desc_init_by_tag) memory_desc_init_by_tag;
  decltype(&::dnnl_memory_desc_get_size) memory_desc_get_size;
  decltype(&::dnnl_memory_create) memory_create;
  decltype(&::dnnl_memory_set_data_handle) memory_set_data_handle;
  decltype(&::dnnl_matmul_desc_init) matmul_desc_init;
  decltype(&::dnnl_primitive_attr_create) primitive_attr_create;
  decltype(&::dnnl_primitive_attr_destroy) primitive_attr_destroy;
  decltype(&::dnnl_primitive_attr_set_post_ops) primitive_attr_set_post_ops;
  decltype(&::dnnl_post_ops_create) post_ops_create;
  decltype(&::dnnl_post_ops_destroy) post_ops_destroy;
  decltype(&::dnnl_post_ops_append_sum) post_ops_append_sum;
  decltype(&::dnnl_primitive_desc_create) primitive_desc_create;
  decltype(&::dnnl_primitive_desc_destroy) primitive_desc_destroy;
  decltype(&::dnnl_primitive_desc_query) primitive_desc_query;
  decltype(&::dnnl_primitive_desc_query_md) primitive_desc_query_md;
  decltype(&::dnnl_reorder_primitive_desc_create) reorder_primitive_desc_create;
  decltype(&::dnnl_primitive_create) primitive_create;
  decltype(&::dnnl_primitive_execute) primitive_execute;
  decltype(&::dnnl_get_effective_cpu_isa) get_effective_cpu_isa;
  decltype(&::dnnl_sgemm) sgemm;
  decltype(&::dnnl_version) version;
  std::string path;  // the file it was loaded from
};

// The library, loaded on the first call (libdnnl.so.2, then libdnnl.so). Throws lt::Error saying
// what was tried and how to install it when it cannot be loaded.
const Library& library();
// Whether library() would succeed, without throwing; *why gets the reason when not.
bool library_available(std::string* why);

// Throws lt::Error "oneDNN <what>: <status name>" unless status is dnnl_success.
void check(dnnl_status_t status, const char* what);

}  // namespace lt::cpu::onednn
