// The safetensors container (Hugging Face's tensor file format), read as UNTRUSTED input and
// written for fp32 or bf16 tensors.
//
// File layout (all little-endian):
//   u64 N                 length of the JSON header
//   N bytes               UTF-8 JSON object, padded with spaces:
//                           "<tensor name>": {"dtype": "F16", "shape": [d0, d1, ...],
//                                             "data_offsets": [begin, end]},
//                           "__metadata__": {"<key>": "<string value>", ...}   (optional)
//   the data section      tensor bytes, row-major; data_offsets are relative to its start
//
// Every number in the header is checked before it sizes anything: N is bounded (kMaxHeaderBytes
// and the file size), each tensor's dtype is known, its shape's element count times the dtype
// size equals end - begin (with overflow checks), ranges lie inside the data section and no two
// overlap. Errors name the file (the `origin` argument) and the tensor.
//
// This file and src/ckpt/safetensors.cpp depend on nothing but the standard library,
// nlohmann::json and fsutil, so the fuzz target (tests/fuzz) compiles them alone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lt::safetensors {

// The dtypes of the safetensors specification that have a whole number of bytes per element.
enum class Dtype { kBool, kU8, kI8, kF8E5M2, kF8E4M3, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64 };
const char* dtype_name(Dtype d);  // "F16", "BF16", ...
size_t dtype_size(Dtype d);       // bytes per element

// safetensors' own reader refuses headers above 100 MB; so do we, before allocating one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Rank limit: real tensors have <= 8 dimensions; a bound keeps a hostile header cheap to check.
constexpr size_t kMaxRank = 16;

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range [begin, end) within the data section
  uint64_t numel() const;       // product of shape (1 for a scalar); cannot overflow once parsed
  uint64_t bytes() const { return end - begin; }
};

struct Header {
  uint64_t data_start = 0;                      // file offset of the data section: 8 + N
  uint64_t data_size = 0;                       // bytes in the data section: file size - data_start
  std::vector<TensorEntry> tensors;             // ordered by begin (file order)
  std::map<std::string, std::string> metadata;  // "__metadata__"
  const TensorEntry* find(const std::string& name) const;
};

// Step 1: the 8-byte prefix of a file of file_size bytes -> N, checked against kMaxHeaderBytes
// and the file size. Throws when file_size < 8.
uint64_t parse_header_length(std::string_view prefix8, uint64_t file_size, const std::string& origin);
// Step 2: the N header bytes (read only after step 1 accepted N) of a file of file_size bytes.
Header parse_header(std::string_view json, uint64_t file_size, const std::string& origin);
// Both steps over a whole file held in memory (tests and the fuzz target).
Header parse(std::string_view file, const std::string& origin);

// Converts one F32, F16 or BF16 tensor's raw bytes (t.bytes() of them) to fp32 in out (t.numel()
// floats). Throws naming origin and the tensor for any other dtype.
void convert_to_f32(float* out, const TensorEntry& t, const void* raw, const std::string& origin);

// IEEE half and bfloat16 <-> fp32. bf16 rounds to nearest, ties to even; NaN stays a (quiet) NaN.
float f16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);

// A file on disk: the header is read and validated on construction; tensors are read on demand,
// so a sharded model never has more than one tensor's raw bytes in memory besides its output.
class Reader {
 public:
  explicit Reader(const std::string& path);
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  ~Reader();
  const std::string& path() const;
  const Header& header() const;
  // Reads tensor t (an entry of header()) into out, t.numel() floats, converting F16/BF16.
  void read_f32(const TensorEntry& t, float* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TensorToWrite {
  std::string name;
  std::vector<uint64_t> shape;
  const float* data = nullptr;  // numel(shape) floats
};
// Bytes the data section of a file of these tensors takes in `dtype` (F32 or BF16).
uint64_t data_bytes(const std::vector<TensorToWrite>& tensors, Dtype dtype);
// Writes tensors in the given order, stored as dtype (F32, or BF16 rounded to nearest even), with
// the header padded to a multiple of 8 bytes as the reference writer does; published atomically.
void write_file(const std::string& path, const std::vector<TensorToWrite>& tensors, Dtype dtype,
                const std::map<std::string, std::string>& metadata);

}  // namespace lt::safetensors
