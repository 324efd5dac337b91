// safetensors reading (untrusted input: everything checked before it sizes an allocation) and
// writing. The format is specified by Hugging Face's safetensors README; this is our own reader.
#include "llamatrain/safetensors.h"

#include <cerrno>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/json_read.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

namespace lt::safetensors {
namespace {

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 1},      {Dtype::kU8, "U8", 1},   {Dtype::kI8, "I8", 1},   {Dtype::kF8E5M2, "F8_E5M2", 1},
    {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kI16, "I16", 2}, {Dtype::kU16, "U16", 2}, {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},      {Dtype::kI32, "I32", 4}, {Dtype::kU32, "U32", 4}, {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},        {Dtype::kI64, "I64", 8}, {Dtype::kU64, "U64", 8},
};

// A real header is three levels deep (root, tensor entry, shape array).
constexpr int kMaxHeaderDepth = 8;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += strcat(i ? ", " : "", shape[i]);
  return s + ")";
}

// One tensor entry of the header; `bad(what)` throws naming the file and the tensor.
TensorEntry parse_entry(const std::string& name, const nlohmann::json& v, uint64_t data_size,
                        const std::string& origin) {
  auto bad = [&](const std::string& what) { fail(strcat(origin, ": safetensors tensor '", name, "': ", what)); };
  if (!v.is_object()) bad("header entry is not a JSON object");
  TensorEntry t;
  t.name = name;

  const auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) bad("no \"dtype\" string");
  const std::string& dname = dtype->get_ref<const std::string&>();
  const DtypeInfo* info = nullptr;
  for (const auto& d : kDtypes)
    if (dname == d.name) info = &d;
  if (!info) bad(strcat("unknown dtype '", dname, "'"));
  t.dtype = info->dtype;

  const auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) bad("no \"shape\" array");
  if (shape->size() > kMaxRank)
    bad(strcat("shape has ", shape->size(), " dimensions, at most ", kMaxRank, " accepted"));
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned()) bad(strcat("shape entry ", d.dump(), " is not a non-negative integer"));
    const uint64_t n = d.get<uint64_t>();
    t.shape.push_back(n);
    overflow = overflow || __builtin_mul_overflow(numel, n, &numel);
  }
  uint64_t expected = 0;
  if (overflow || __builtin_mul_overflow(numel, uint64_t(info->size), &expected))
    bad(strcat("shape ", shape_text(t.shape), " overflows 64 bits"));

  const auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    bad("\"data_offsets\" is not [begin, end] of two non-negative integers");
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  if (t.begin > t.end) bad(strcat("data_offsets [", t.begin, ", ", t.end, "] end before they begin"));
  if (t.end > data_size)
    bad(strcat("data_offsets [", t.begin, ", ", t.end, "] reach past the data section (", data_size,
               " bytes; truncated file?)"));
  if (t.end - t.begin != expected)
    bad(strcat("shape ", shape_text(t.shape), " of ", info->name, " needs ", expected, " bytes but data_offsets [",
               t.begin, ", ", t.end, "] hold ", t.end - t.begin));
  return t;
}

}  // namespace

const char* dtype_name(Dtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i.name;
  return "?";
}

size_t dtype_size(Dtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i.size;
  return 0;
}

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // checked for overflow when the header was parsed
  return n;
}

const TensorEntry* Header::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t parse_header_length(std::string_view prefix8, uint64_t file_size, const std::string& origin) {
  if (file_size < 8 || prefix8.size() < 8)
    fail(strcat(origin, ": too short for a safetensors file (", file_size, " bytes; the header length alone takes 8)"));
  uint64_t n = 0;
  std::memcpy(&n, prefix8.data(), 8);
  if (n > kMaxHeaderBytes)
    fail(strcat(origin, ": safetensors header length ", n, " exceeds the ", kMaxHeaderBytes,
                "-byte limit (not a safetensors file, or damaged)"));
  if (n > file_size - 8)
    fail(strcat(origin, ": safetensors header length ", n, " reaches past the end of the file (", file_size,
                " bytes; truncated?)"));
  return n;
}

Header parse_header(std::string_view text, uint64_t file_size, const std::string& origin) {
  LT_CHECK(file_size >= 8 && text.size() <= file_size - 8, "header bytes exceed the file");
  Header h;
  h.data_start = 8 + text.size();
  h.data_size = file_size - h.data_start;
  if (text.empty() || text.front() != '{')
    fail(strcat(origin, ": safetensors header does not start with '{' (not a safetensors file?)"));

  check_json_depth(text, strcat(origin, " (safetensors header)"), 1, kMaxHeaderDepth);
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(strcat(origin, ": safetensors header is not valid JSON"));
  if (!j.is_object()) fail(strcat(origin, ": safetensors header is not a JSON object"));

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(strcat(origin, ": safetensors __metadata__ is not a JSON object"));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(strcat(origin, ": safetensors __metadata__ entry '", mk, "' is not a string"));
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, h.data_size, origin));
  }

  // Ranges must not overlap: sorted by begin, each starts at or after the previous one's end.
  // (safetensors' writer leaves no holes; holes are harmless to us, so they are accepted.)
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const TensorEntry& a = h.tensors[i - 1];
    const TensorEntry& b = h.tensors[i];
    if (b.begin < a.end)
      fail(strcat(origin, ": safetensors tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name, "' [",
                  b.begin, ", ", b.end, ") overlap"));
  }
  return h;
}

Header parse(std::string_view file, const std::string& origin) {
  const uint64_t n = parse_header_length(file.substr(0, 8), file.size(), origin);
  return parse_header(file.substr(8, n), file.size(), origin);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf, NaN (payload kept)
  if (exp != 0) return float_of(sign | ((exp + 127 - 15) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24 is exact in fp32.
  return float_of(sign | bits_of(float(mant) * 0x1p-24f));
}

float bf16_to_f32(uint16_t b) { return float_of(uint32_t(b) << 16); }

uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: keep it a quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. Values
  // above the largest bf16 round to infinity, as IEEE rounding does.
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

void convert_to_f32(float* out, const TensorEntry& t, const void* raw, const std::string& origin) {
  const uint64_t n = t.numel();
  const auto* bytes = static_cast<const unsigned char*>(raw);
  switch (t.dtype) {
    case Dtype::kF32:
      std::memcpy(out, raw, n * 4);
      return;
    case Dtype::kF16:
    case Dtype::kBF16: {
      const bool half = t.dtype == Dtype::kF16;
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, 2);
        out[i] = half ? f16_to_f32(v) : bf16_to_f32(v);
      }
      return;
    }
    default:
      fail(strcat(origin, ": safetensors tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                  "; model weights must be F32, F16 or BF16"));
  }
}

struct Reader::Impl {
  std::string path;
  Header header;
  mutable std::ifstream in;
};

Reader::Reader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->in.open(path, std::ios::binary);
  if (!impl_->in) fail(strcat(path, ": cannot open"));
  const uint64_t size = file_size(path);
  char prefix[8] = {};
  impl_->in.read(prefix, 8);
  const uint64_t n = parse_header_length(std::string_view(prefix, size_t(impl_->in.gcount())), size, path);
  std::string json(n, '\0');  // n <= kMaxHeaderBytes and <= the file size: checked above
  impl_->in.read(json.data(), std::streamsize(n));
  if (!impl_->in) fail(strcat(path, ": unexpected end of file in the safetensors header"));
  impl_->header = parse_header(json, size, path);
}

Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;
Reader::~Reader() = default;
const std::string& Reader::path() const { return impl_->path; }
const Header& Reader::header() const { return impl_->header; }

void Reader::read_f32(const TensorEntry& t, float* out) const {
  if (t.dtype != Dtype::kF32 && t.dtype != Dtype::kF16 && t.dtype != Dtype::kBF16)
    convert_to_f32(out, t, nullptr, impl_->path);  // throws the dtype message
  auto& in = impl_->in;
  in.clear();
  in.seekg(std::streamoff(impl_->header.data_start + t.begin));
  auto read = [&](void* dst, uint64_t nbytes) {
    in.read(static_cast<char*>(dst), std::streamsize(nbytes));
    if (!in)
      fail(strcat(impl_->path, ": unexpected end of file reading tensor '", t.name,
                  "' (the file changed after its header was read?)"));
  };
  if (t.dtype == Dtype::kF32) {
    read(out, t.bytes());
    return;
  }
  // Two-byte dtypes: converted in slices so the raw copy never needs a tensor-sized buffer.
  constexpr uint64_t kSlice = 1 << 20;
  std::vector<uint16_t> buf(std::min<uint64_t>(kSlice, t.numel()));
  TensorEntry slice = t;
  for (uint64_t i = 0, n = t.numel(); i < n; i += kSlice) {
    const uint64_t m = std::min(kSlice, n - i);
    read(buf.data(), 2 * m);
    slice.shape = {m};
    convert_to_f32(out + i, slice, buf.data(), impl_->path);
  }
}

uint64_t data_bytes(const std::vector<TensorToWrite>& tensors, Dtype dtype) {
  uint64_t total = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    total += n * dtype_size(dtype);
  }
  return total;
}

void write_file(const std::string& path, const std::vector<TensorToWrite>& tensors, Dtype dtype,
                const std::map<std::string, std::string>& metadata) {
  LT_CHECK(dtype == Dtype::kF32 || dtype == Dtype::kBF16, "safetensors writer stores F32 or BF16, not ",
           dtype_name(dtype));
  const size_t esize = dtype_size(dtype);
  // ordered_json keeps the header in file order, which makes `head -c` of a file readable.
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    header[t.name] = {{"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n * esize}}};
    offset += n * esize;
  }
  std::string json = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  json.append((8 - json.size() % 8) % 8, ' ');

  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(strcat(tmp, ": cannot create"));
  bool ok = true;
  int saved_errno = 0;  // why the first failed write failed
  auto put = [&](const void* p, size_t n) {
    if (ok && std::fwrite(p, 1, n, f) != n) ok = false, saved_errno = errno;
  };
  const uint64_t n = json.size();
  put(&n, 8);
  put(json.data(), json.size());
  std::vector<uint16_t> buf;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (uint64_t d : t.shape) numel *= d;
    if (dtype == Dtype::kF32) {
      put(t.data, numel * 4);
      continue;
    }
    constexpr uint64_t kSlice = 1 << 20;
    for (uint64_t i = 0; i < numel; i += kSlice) {
      const uint64_t m = std::min(kSlice, numel - i);
      buf.resize(m);
      for (uint64_t k = 0; k < m; ++k) buf[k] = f32_to_bf16(t.data[i + k]);
      put(buf.data(), 2 * m);
    }
  }
  if (std::fclose(f) != 0 && ok) ok = false, saved_errno = errno;
  if (!ok) {
    std::remove(tmp.c_str());
    fail(strcat(tmp, ": write failed (", saved_errno ? std::strerror(saved_errno) : "unknown error", ")"));
  }
  try {
    publish_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace lt::safetensors
