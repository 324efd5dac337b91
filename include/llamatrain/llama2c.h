// llama2.c v0 ".bin" models (LLAMA2C_BIN_FORMAT.md), read as UNTRUSTED input: the 28-byte header
// is checked field by field and against the file size before anything is allocated, so a
// hostile header cannot make us allocate more than the file itself holds.
//
// This file and src/ckpt/llama2c.cpp need only the model layout and fsutil (no HDF5, no MPI), so
// the fuzz target (tests/fuzz) compiles them alone.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "llamatrain/model_io.h"

namespace lt {

constexpr size_t kLlama2cHeaderBytes = 7 * sizeof(int32_t);

// The config described by a v0 header (its first 28 bytes) of a file of file_size bytes; throws
// naming origin when a field is out of range or the header implies another file size.
Llama2Config llama2c_parse_header(std::string_view header, uint64_t file_size, const std::string& origin);
// A whole v0 file held in memory (tests and the fuzz target).
ModelData llama2c_parse(std::string_view file, const std::string& origin);
// Streams a v0 file into the flat buffer (no second copy of the weights).
ModelData load_llama2c(const std::string& path);
// The v0 bytes of a model; save_model_llama2c (model_io.h) publishes them atomically.
std::string llama2c_serialize(const ModelData& model);

}  // namespace lt
