// RAII wrapper over the HDF5 C API. Automatic error printing is switched off; instead every
// failing call is turned into an lt::Error whose message names the file and object and ends
// with the HDF5 error stack (collected with H5Ewalk2), innermost cause last.
#include "llamatrain/h5.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <utility>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt::h5 {
namespace {

// Debian's libhdf5 is built without --enable-threadsafe, so two threads inside the library at
// once (say an asynchronous checkpoint writer and the data loader) corrupt its state. Every
// wrapper entry point holds this process-wide lock; it is recursive because entry points call
// each other. The guard also switches off HDF5's default stderr printer, since the error stack
// is reported through our exceptions instead.
//
// HDF5's own exit handler is switched off (H5dont_atexit, before the library's first use): after a
// write failed (a full disk), a file whose H5Fclose failed stays half-closed inside the library, and
// the handler's attempt to close it again at exit crashed in H5F__close_cb after our clear error
// had been printed. Every file we open is closed by its owner (File::close, File::Impl), so the
// handler has nothing of ours left to do.
std::unique_lock<std::recursive_mutex> enter_hdf5() {
  static const bool no_exit_handler = H5dont_atexit() >= 0;
  (void)no_exit_handler;
  static std::recursive_mutex mutex;
  std::unique_lock<std::recursive_mutex> lock(mutex);
  thread_local bool quiet = false;
  if (!quiet) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    quiet = true;
  }
  return lock;
}

herr_t collect_error(unsigned n, const H5E_error2_t* err, void* client) {
  auto* out = static_cast<std::string*>(client);
  char minor[256] = "";
  H5Eget_msg(err->min_num, nullptr, minor, sizeof(minor));
  // Numbered like HDF5's own printer (#000 outermost); some descriptions embed ctime()'s
  // newline, which would break the one-line-per-frame layout.
  std::string desc = err->desc ? err->desc : "";
  std::replace(desc.begin(), desc.end(), '\n', ' ');
  char num[16];
  std::snprintf(num, sizeof(num), "%03u", n);
  *out += strcat("\n  HDF5 #", num, ": ", err->func_name ? err->func_name : "?", "(): ", desc,
                 minor[0] ? strcat(" (", minor, ")") : "");
  return 0;
}

// The current thread's HDF5 error stack as text (empty when there is none); clears it.
std::string error_stack() {
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &out);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

// The operating system's reason when the stack has one (the sec2 driver's "error message =
// 'No space left on device'"), so the first line of the error says why a write failed.
std::string system_reason(const std::string& stack) {
  const std::string key = "error message = '";
  const size_t at = stack.rfind(key);
  if (at == std::string::npos) return "";
  const size_t end = stack.find('\'', at + key.size());
  return end == std::string::npos ? "" : " (" + stack.substr(at + key.size(), end - at - key.size()) + ")";
}

[[noreturn]] void h5_fail(const std::string& what) {
  const std::string stack = error_stack();
  throw Error(what + system_reason(stack) + stack);
}

// Owns one hid_t and closes it with the matching H5?close; never throws.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handles are passed straight to H5 calls

 private:
  void reset() noexcept {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Wraps a freshly returned id or throws `what` with the error stack.
Handle checked(hid_t id, Handle::Closer closer, const std::string& what) {
  if (id < 0) h5_fail(what);
  return Handle(id, closer);
}

void check(herr_t rc, const std::string& what) {
  if (rc < 0) h5_fail(what);
}

uint64_t numel(const Dims& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

std::string dims_text(const Dims& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += strcat(i ? ", " : "", dims[i]);
  return s + ")";
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    case H5T_COMPOUND: return "a compound";
    case H5T_ENUM: return "an enum";
    case H5T_ARRAY: return "an array";
    case H5T_VLEN: return "a variable-length";
    case H5T_OPAQUE: return "an opaque";
    case H5T_REFERENCE: return "a reference";
    case H5T_BITFIELD: return "a bitfield";
    case H5T_TIME: return "a time";
    default: return "an unknown";
  }
}

// Memory (native) and file (fixed little-endian, so files are the same on every host) types.
template <class T> struct TypeOf;
template <> struct TypeOf<float> {
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
  static hid_t file() { return H5T_IEEE_F32LE; }
  static constexpr const char* name = "float32";
};
template <> struct TypeOf<double> {
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
  static hid_t file() { return H5T_IEEE_F64LE; }
  static constexpr const char* name = "float64";
};
template <> struct TypeOf<int32_t> {
  static hid_t mem() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
  static constexpr const char* name = "int32";
};
template <> struct TypeOf<int64_t> {
  static hid_t mem() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
  static constexpr const char* name = "int64";
};
template <> struct TypeOf<int8_t> {
  static hid_t mem() { return H5T_NATIVE_INT8; }
  static hid_t file() { return H5T_STD_I8LE; }
  static constexpr const char* name = "int8";
};
template <> struct TypeOf<uint8_t> {
  static hid_t mem() { return H5T_NATIVE_UINT8; }
  static hid_t file() { return H5T_STD_U8LE; }
  static constexpr const char* name = "uint8";
};
template <> struct TypeOf<uint16_t> {
  static hid_t mem() { return H5T_NATIVE_UINT16; }
  static hid_t file() { return H5T_STD_U16LE; }
  static constexpr const char* name = "uint16";
};
template <> struct TypeOf<uint64_t> {
  static hid_t mem() { return H5T_NATIVE_UINT64; }
  static hid_t file() { return H5T_STD_U64LE; }
  static constexpr const char* name = "uint64";
};

// Chunk shape for compressed datasets: the full extent, with leading dimensions halved until a
// chunk is at most ~1 MiB, so row reads touch few chunks and deflate works on large blocks.
Dims chunk_dims(const Dims& dims, size_t elem_size) {
  Dims chunk = dims;
  constexpr uint64_t kTargetBytes = 1 << 20;
  for (size_t i = 0; i < chunk.size(); ++i) {
    while (chunk[i] > 1 && numel(chunk) * elem_size > kTargetBytes) chunk[i] = (chunk[i] + 1) / 2;
  }
  return chunk;
}

// Variable-length UTF-8 strings, the form h5py uses for Python str.
Handle vlen_utf8_type() {
  Handle type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type, H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(type, H5T_CSET_UTF8), "H5Tset_cset");
  return type;
}

// One fixed-length string of `size` bytes with the writer's padding undone.
std::string unpad(const char* p, size_t size, H5T_str_t pad) {
  std::string s(p, size);
  if (pad == H5T_STR_SPACEPAD) {
    size_t end = s.find_last_not_of(' ');
    s.resize(end == std::string::npos ? 0 : end + 1);
  } else {
    size_t nul = s.find('\0');
    if (nul != std::string::npos) s.resize(nul);
  }
  return s;
}

// Reads n strings of string type `ftype` (variable or fixed length) with `read(mem_type, buf)`
// (H5Aread or H5Dread).
std::vector<std::string> read_string_values(hid_t ftype, size_t n, const std::function<herr_t(hid_t, void*)>& read,
                                            const std::string& where) {
  std::vector<std::string> out;
  htri_t vlen = H5Tis_variable_str(ftype);
  if (vlen < 0) h5_fail(where);
  if (vlen > 0) {
    Handle mtype = vlen_utf8_type();
    check(H5Tset_cset(mtype, H5Tget_cset(ftype)), "H5Tset_cset");
    std::vector<char*> ptrs(n, nullptr);
    if (n > 0) check(read(mtype, ptrs.data()), where + ": cannot read");
    for (char* p : ptrs) {
      out.emplace_back(p ? p : "");
      H5free_memory(p);
    }
    return out;
  }
  const size_t size = H5Tget_size(ftype);
  std::string buf(size * n, '\0');
  if (n > 0) check(read(ftype, buf.data()), where + ": cannot read");
  const H5T_str_t pad = H5Tget_strpad(ftype);
  for (size_t i = 0; i < n; ++i) out.push_back(unpad(buf.data() + i * size, size, pad));
  return out;
}

// The shortest decimal (at most 9 significant digits, which always suffice) that reads back as
// v, as a double: what the user most likely wrote.
double shortest_decimal(float v) {
  if (!std::isfinite(v)) return double(v);
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    if (std::strtof(buf, nullptr) == v) return std::strtod(buf, nullptr);
  }
  return double(v);
}

}  // namespace

struct File::Impl {
  std::string path;
  hid_t file = H5I_INVALID_HID;

  ~Impl() {
    const auto guard = enter_hdf5();
    if (file >= 0) {
      H5Fclose(file);
      H5Eclear2(H5E_DEFAULT);
    }
  }

  hid_t id() const {
    if (file < 0) fail(strcat(path, ": file is closed"));
    return file;
  }

  // Walks the path one component at a time because H5Lexists fails (rather than returning 0)
  // when an intermediate group is missing.
  bool exists(const std::string& name) const {
    if (name.empty() || name[0] != '/') fail(strcat(path, ": object path '", name, "' is not absolute"));
    // "/train/" names the same group as "/train".
    const std::string obj = name.size() > 1 && name.back() == '/' ? name.substr(0, name.size() - 1) : name;
    if (obj == "/") return true;
    size_t pos = 1;
    while (pos <= obj.size()) {
      size_t slash = obj.find('/', pos);
      if (slash == std::string::npos) slash = obj.size();
      std::string prefix = obj.substr(0, slash);
      htri_t rc = H5Lexists(id(), prefix.c_str(), H5P_DEFAULT);
      if (rc < 0) h5_fail(strcat(path, ": cannot look up ", prefix));
      if (rc == 0) return false;
      pos = slash + 1;
    }
    return true;
  }

  void require(const std::string& obj) const {
    if (!exists(obj)) fail(strcat(path, ": no object ", obj));
  }

  Handle open_object(const std::string& obj) const {
    require(obj);
    return checked(H5Oopen(id(), obj.c_str(), H5P_DEFAULT), H5Oclose,
                   strcat(path, ": cannot open ", obj));
  }

  Handle open_dataset(const std::string& obj) const {
    Handle o = open_object(obj);
    if (H5Iget_type(o) != H5I_DATASET) fail(strcat(path, ": ", obj, " is not a dataset"));
    return o;
  }

  Handle open_attr(const std::string& obj, const std::string& name) const {
    Handle o = open_object(obj);
    htri_t has = H5Aexists(o, name.c_str());
    if (has < 0) h5_fail(strcat(path, ": cannot look up attribute ", name, " of ", obj));
    if (has == 0) fail(strcat(path, ": ", obj, " has no attribute ", name));
    return checked(H5Aopen(o, name.c_str(), H5P_DEFAULT), H5Aclose,
                   strcat(path, ": cannot open attribute ", name, " of ", obj));
  }

  // Replaces any attribute of that name (its type may differ) and writes one value, or with
  // `count` a 1-D list of count values (an empty list has HDF5's null dataspace).
  void write_attr(const std::string& obj, const std::string& name, hid_t file_type,
                  hid_t mem_type, const void* value, const hsize_t* count = nullptr) {
    const std::string where = strcat(path, ": attribute ", name, " of ", obj);
    Handle o = open_object(obj);
    htri_t has = H5Aexists(o, name.c_str());
    if (has < 0) h5_fail(where + ": cannot look up");
    if (has > 0) check(H5Adelete(o, name.c_str()), where + ": cannot replace");
    Handle space = !count      ? checked(H5Screate(H5S_SCALAR), H5Sclose, where + ": dataspace")
                   : *count == 0 ? checked(H5Screate(H5S_NULL), H5Sclose, where + ": dataspace")
                                 : checked(H5Screate_simple(1, count, nullptr), H5Sclose, where + ": dataspace");
    Handle attr = checked(H5Acreate2(o, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                          H5Aclose, where + ": cannot create");
    if (count && *count == 0) return;  // a null dataspace holds nothing to write
    check(H5Awrite(attr, mem_type, value), where + ": cannot write");
  }

  // Opens an attribute that must hold one value of one of the accepted classes.
  Handle open_scalar_attr(const std::string& obj, const std::string& name,
                          std::initializer_list<H5T_class_t> accepted, const char* wanted) const {
    Handle attr = open_attr(obj, name);
    Handle type = checked(H5Aget_type(attr), H5Tclose, strcat(path, ": attribute ", name));
    H5T_class_t cls = H5Tget_class(type);
    if (std::find(accepted.begin(), accepted.end(), cls) == accepted.end())
      fail(strcat(path, ": attribute ", name, " of ", obj, " is ", class_name(cls),
                  ", expected ", wanted));
    Handle space = checked(H5Aget_space(attr), H5Sclose, strcat(path, ": attribute ", name));
    hssize_t n = H5Sget_simple_extent_npoints(space);
    if (n != 1)
      fail(strcat(path, ": attribute ", name, " of ", obj, " holds ", n, " values, expected 1"));
    return attr;
  }

  // Opens a list attribute (1-D, or a scalar as one element) of the accepted class; *n its length.
  Handle open_list_attr(const std::string& obj, const std::string& name, H5T_class_t accepted,
                        const char* wanted, hssize_t* n) const {
    Handle attr = open_attr(obj, name);
    Handle type = checked(H5Aget_type(attr), H5Tclose, strcat(path, ": attribute ", name));
    H5T_class_t cls = H5Tget_class(type);
    if (cls != accepted)
      fail(strcat(path, ": attribute ", name, " of ", obj, " is ", class_name(cls), ", expected ", wanted));
    Handle space = checked(H5Aget_space(attr), H5Sclose, strcat(path, ": attribute ", name));
    if (H5Sget_simple_extent_ndims(space) > 1)
      fail(strcat(path, ": attribute ", name, " of ", obj, " has ", H5Sget_simple_extent_ndims(space),
                  " dimensions, expected a list"));
    *n = H5Sget_simple_extent_npoints(space);
    if (*n < 0) h5_fail(strcat(path, ": attribute ", name, " of ", obj));
    return attr;
  }

  void write_1d(const std::string& obj, hid_t file_type, hid_t mem_type, const void* data, hsize_t n);

  Dims shape(hid_t dset, const std::string& obj) const {
    Handle space = checked(H5Dget_space(dset), H5Sclose, strcat(path, ": dataspace of ", obj));
    int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0) h5_fail(strcat(path, ": rank of ", obj));
    std::vector<hsize_t> d(static_cast<size_t>(rank));
    if (rank > 0 && H5Sget_simple_extent_dims(space, d.data(), nullptr) < 0)
      h5_fail(strcat(path, ": extent of ", obj));
    return Dims(d.begin(), d.end());
  }

  // Rejects datasets whose elements cannot be converted to a number (strings, compounds...)
  // with a readable message instead of HDF5's "conversion not supported".
  void require_numeric(hid_t dset, const std::string& obj, const char* wanted) const {
    Handle type = checked(H5Dget_type(dset), H5Tclose, strcat(path, ": type of ", obj));
    H5T_class_t cls = H5Tget_class(type);
    if (cls != H5T_INTEGER && cls != H5T_FLOAT)
      fail(strcat(path, ": ", obj, " is ", class_name(cls), " dataset, cannot read it as ", wanted));
  }
};

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::create(const std::string& path) {
  const auto guard = enter_hdf5();
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (impl->file < 0) h5_fail(strcat(path, ": cannot create HDF5 file"));
  return File(std::move(impl));
}

File File::create_aligned(const std::string& path, uint64_t align_min_bytes, uint64_t alignment) {
  const auto guard = enter_hdf5();
  const std::string where = strcat(path, ": file access properties");
  Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, where);
  check(H5Pset_alignment(fapl, align_min_bytes, alignment), where + ": alignment");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (impl->file < 0) h5_fail(strcat(path, ": cannot create HDF5 file"));
  return File(std::move(impl));
}

File File::open_read(const std::string& path) {
  const auto guard = enter_hdf5();
  if (!file_exists(path)) fail(strcat(path, ": cannot open (no such file)"));
  refuse_special_file(path, "HDF5 file");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (impl->file < 0) {
    // A file without the signature is the common user mistake (wrong path or format); say so
    // plainly. HDF5 also accepts the signature after a user block, hence H5Fis_hdf5.
    if (!is_hdf5_file(path) && H5Fis_hdf5(path.c_str()) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      fail(strcat(path, ": not an HDF5 file"));
    }
    h5_fail(strcat(path, ": cannot open HDF5 file"));
  }
  return File(std::move(impl));
}

void File::close() {
  if (!impl_ || impl_->file < 0) return;
  const auto guard = enter_hdf5();
  hid_t f = std::exchange(impl_->file, H5I_INVALID_HID);
  check(H5Fclose(f), strcat(impl_->path, ": cannot close (flush failed)"));
}

const std::string& File::path() const { return impl_->path; }

bool File::exists(const std::string& obj) const {
  const auto guard = enter_hdf5();
  return impl_->exists(obj);
}

void File::create_group(const std::string& group) {
  const auto guard = enter_hdf5();
  if (impl_->exists(group)) return;
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate(link)");
  check(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  checked(H5Gcreate2(impl_->id(), group.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
          strcat(impl_->path, ": cannot create group ", group));
}

std::vector<std::string> File::list(const std::string& group) const {
  const auto guard = enter_hdf5();
  Handle g = impl_->open_object(group);
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  check(H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, cb, &names),
        strcat(impl_->path, ": cannot list ", group));
  std::sort(names.begin(), names.end());
  return names;
}

void File::write_attr(const std::string& obj, const std::string& name, const std::string& value) {
  const auto guard = enter_hdf5();
  Handle type = vlen_utf8_type();
  const char* p = value.c_str();
  impl_->write_attr(obj, name, type, type, &p);
}

void File::write_attr(const std::string& obj, const std::string& name, int64_t value) {
  const auto guard = enter_hdf5();
  impl_->write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void File::write_attr(const std::string& obj, const std::string& name, double value) {
  const auto guard = enter_hdf5();
  impl_->write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void File::write_attr(const std::string& obj, const std::string& name, float value) {
  write_attr(obj, name, shortest_decimal(value));
}

void File::write_attr_ints(const std::string& obj, const std::string& name, const std::vector<int64_t>& values) {
  const auto guard = enter_hdf5();
  const hsize_t n = values.size();
  impl_->write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, values.data(), &n);
}

void File::write_attr_strings(const std::string& obj, const std::string& name,
                              const std::vector<std::string>& values) {
  const auto guard = enter_hdf5();
  Handle type = vlen_utf8_type();
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  const hsize_t n = values.size();
  impl_->write_attr(obj, name, type, type, ptrs.data(), &n);
}

bool File::has_attr(const std::string& obj, const std::string& name) const {
  const auto guard = enter_hdf5();
  Handle o = impl_->open_object(obj);
  htri_t has = H5Aexists(o, name.c_str());
  if (has < 0) h5_fail(strcat(impl_->path, ": cannot look up attribute ", name, " of ", obj));
  return has > 0;
}

std::string File::read_attr_string(const std::string& obj, const std::string& name) const {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": attribute ", name, " of ", obj);
  Handle attr = impl_->open_scalar_attr(obj, name, {H5T_STRING}, "a string");
  Handle ftype = checked(H5Aget_type(attr), H5Tclose, where);
  return read_string_values(ftype, 1, [&](hid_t mtype, void* buf) { return H5Aread(attr, mtype, buf); }, where)[0];
}

int64_t File::read_attr_int(const std::string& obj, const std::string& name) const {
  const auto guard = enter_hdf5();
  Handle attr = impl_->open_scalar_attr(obj, name, {H5T_INTEGER}, "an integer");
  int64_t v = 0;
  check(H5Aread(attr, H5T_NATIVE_INT64, &v),
        strcat(impl_->path, ": attribute ", name, " of ", obj, ": cannot read"));
  return v;
}

double File::read_attr_double(const std::string& obj, const std::string& name) const {
  const auto guard = enter_hdf5();
  // Integers are accepted too: a writer (e.g. h5py) may store 0 for a fraction like test_split.
  Handle attr = impl_->open_scalar_attr(obj, name, {H5T_FLOAT, H5T_INTEGER}, "a number");
  double v = 0;
  check(H5Aread(attr, H5T_NATIVE_DOUBLE, &v),
        strcat(impl_->path, ": attribute ", name, " of ", obj, ": cannot read"));
  return v;
}

std::vector<int64_t> File::read_attr_ints(const std::string& obj, const std::string& name) const {
  const auto guard = enter_hdf5();
  hssize_t n = 0;
  Handle attr = impl_->open_list_attr(obj, name, H5T_INTEGER, "a list of integers", &n);
  std::vector<int64_t> out(size_t(n), 0);
  if (n > 0)
    check(H5Aread(attr, H5T_NATIVE_INT64, out.data()),
          strcat(impl_->path, ": attribute ", name, " of ", obj, ": cannot read"));
  return out;
}

std::vector<std::string> File::read_attr_strings(const std::string& obj, const std::string& name) const {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": attribute ", name, " of ", obj);
  hssize_t n = 0;
  Handle attr = impl_->open_list_attr(obj, name, H5T_STRING, "a list of strings", &n);
  Handle ftype = checked(H5Aget_type(attr), H5Tclose, where);
  return read_string_values(ftype, size_t(n), [&](hid_t mtype, void* buf) { return H5Aread(attr, mtype, buf); },
                            where);
}

File::Kind File::kind(const std::string& obj) const {
  const auto guard = enter_hdf5();
  Handle dset = impl_->open_dataset(obj);
  Handle type = checked(H5Dget_type(dset), H5Tclose, strcat(impl_->path, ": type of ", obj));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return Kind::kInteger;
    case H5T_FLOAT: return Kind::kFloat;
    case H5T_STRING: return Kind::kString;
    case H5T_ENUM: return Kind::kEnum;
    default: return Kind::kOther;
  }
}

// Creates the 1-D dataset `obj` of n elements of `file_type` (replacing one of that name) and
// writes `data` (in `mem_type`) into it.
void File::Impl::write_1d(const std::string& obj, hid_t file_type, hid_t mem_type, const void* data, hsize_t n) {
  const std::string where = strcat(path, ": dataset ", obj, " (", n, ")");
  if (exists(obj)) check(H5Ldelete(id(), obj.c_str(), H5P_DEFAULT), where + ": cannot replace");
  Handle space = checked(H5Screate_simple(1, &n, nullptr), H5Sclose, where + ": dataspace");
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate(link)");
  check(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  Handle dset = checked(H5Dcreate2(id(), obj.c_str(), file_type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
                        where + ": cannot create");
  if (n > 0) check(H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), where + ": cannot write");
}

void File::write_strings(const std::string& obj, const std::vector<std::string>& values) {
  const auto guard = enter_hdf5();
  Handle type = vlen_utf8_type();
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  impl_->write_1d(obj, type, type, ptrs.data(), values.size());
}

std::vector<std::string> File::read_strings(const std::string& obj) const {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": dataset ", obj);
  Handle dset = impl_->open_dataset(obj);
  Handle ftype = checked(H5Dget_type(dset), H5Tclose, where);
  if (H5Tget_class(ftype) != H5T_STRING)
    fail(strcat(where, " is ", class_name(H5Tget_class(ftype)), " dataset, expected strings"));
  const Dims dims = impl_->shape(dset, obj);
  if (dims.size() > 1) fail(strcat(where, " ", dims_text(dims), " is not a list of strings"));
  auto read = [&](hid_t mtype, void* buf) { return H5Dread(dset, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf); };
  return read_string_values(ftype, size_t(numel(dims)), read, where);
}

void File::write_enum(const std::string& obj, const std::vector<int8_t>& values, const EnumMembers& members) {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": enum dataset ", obj);
  // int8 has no byte order, so one type serves as file and memory type.
  Handle type = checked(H5Tenum_create(H5T_NATIVE_INT8), H5Tclose, where + ": type");
  for (const auto& [name, value] : members) {
    const int8_t v = int8_t(value);
    if (v != value) fail(strcat(where, ": member ", name, " = ", value, " does not fit int8"));
    check(H5Tenum_insert(type, name.c_str(), &v), strcat(where, ": member ", name));
  }
  impl_->write_1d(obj, type, type, values.data(), values.size());
}

std::vector<int64_t> File::read_enum(const std::string& obj, EnumMembers* members) const {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": dataset ", obj);
  Handle dset = impl_->open_dataset(obj);
  Handle ftype = checked(H5Dget_type(dset), H5Tclose, where);
  if (H5Tget_class(ftype) != H5T_ENUM)
    fail(strcat(where, " is ", class_name(H5Tget_class(ftype)), " dataset, expected an enum"));
  // Values and members are read as stored (in the enum's base integer type) and converted to
  // int64 as plain integers: an enum-to-enum conversion would turn a value that is no member
  // into -1 without a word.
  Handle base = checked(H5Tget_super(ftype), H5Tclose, where + ": base type");
  if (H5Tget_size(base) > sizeof(int64_t)) fail(strcat(where, ": enum base type wider than 64 bits"));
  members->clear();
  for (int i = 0, n = H5Tget_nmembers(ftype); i < n; ++i) {
    char* name = H5Tget_member_name(ftype, unsigned(i));
    if (!name) h5_fail(where + ": member name");
    members->emplace_back(name, 0);
    H5free_memory(name);
    check(H5Tget_member_value(ftype, unsigned(i), &members->back().second), where + ": member value");
    check(H5Tconvert(base, H5T_NATIVE_INT64, 1, &members->back().second, nullptr, H5P_DEFAULT),
          where + ": member value");
  }
  std::vector<int64_t> out(numel(impl_->shape(dset, obj)));
  if (!out.empty()) {
    check(H5Dread(dset, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), where + ": cannot read");
    check(H5Tconvert(base, H5T_NATIVE_INT64, out.size(), out.data(), nullptr, H5P_DEFAULT), where + ": cannot read");
  }
  return out;
}

template <class T>
void File::write(const std::string& obj, const Dims& dims, const T* data, bool compress) {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": dataset ", obj, " ", dims_text(dims));
  hid_t f = impl_->id();
  // Overwriting replaces the dataset (its shape may change); the space of the old one is only
  // reclaimed by h5repack, which is acceptable for the write-once files we make.
  if (impl_->exists(obj)) check(H5Ldelete(f, obj.c_str(), H5P_DEFAULT), where + ": cannot replace");
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  Handle space = dims.empty()
                     ? checked(H5Screate(H5S_SCALAR), H5Sclose, where + ": dataspace")
                     : checked(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr),
                               H5Sclose, where + ": dataspace");
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate(link)");
  check(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  Handle dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate(dataset)");
  const uint64_t n = numel(dims);
  // Chunking needs a non-empty, non-scalar extent; tiny or empty datasets stay contiguous.
  if (compress && !dims.empty() && n > 0) {
    Dims c = chunk_dims(dims, sizeof(T));
    std::vector<hsize_t> hc(c.begin(), c.end());
    check(H5Pset_chunk(dcpl, static_cast<int>(hc.size()), hc.data()), where + ": chunking");
    // Byte shuffle before deflate groups the high bytes of small integers (token ids), which
    // compresses far better; it is a built-in filter every HDF5 reader (h5py too) supports.
    check(H5Pset_shuffle(dcpl), where + ": shuffle filter");
    check(H5Pset_deflate(dcpl, 4), where + ": deflate filter");
  }
  Handle dset = checked(H5Dcreate2(f, obj.c_str(), TypeOf<T>::file(), space, lcpl, dcpl,
                                   H5P_DEFAULT),
                        H5Dclose, where + ": cannot create");
  if (n > 0) {
    if (!data) fail(where + ": no data given");
    check(H5Dwrite(dset, TypeOf<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
          where + ": cannot write");
  }
}

template <class T>
uint64_t File::reserve(const std::string& obj, const Dims& dims) {
  // The caller writes the raw bytes itself, so they must already be in the file's byte order.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "reserve() hands out little-endian storage");
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": dataset ", obj, " ", dims_text(dims));
  hid_t f = impl_->id();
  if (impl_->exists(obj)) fail(where + ": already exists");
  if (dims.empty() || numel(dims) == 0) fail(where + ": reserve needs a non-empty, non-scalar extent");
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  Handle space = checked(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr), H5Sclose,
                         where + ": dataspace");
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate(link)");
  check(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  Handle dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate(dataset)");
  // Early allocation gives the dataset its address now (H5Dget_offset is undefined until then);
  // no fill, since the caller overwrites every byte and zeros would be written twice.
  check(H5Pset_layout(dcpl, H5D_CONTIGUOUS), where + ": layout");
  check(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), where + ": allocation time");
  check(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), where + ": fill time");
  Handle dset = checked(H5Dcreate2(f, obj.c_str(), TypeOf<T>::file(), space, lcpl, dcpl, H5P_DEFAULT), H5Dclose,
                        where + ": cannot create");
  const haddr_t offset = H5Dget_offset(dset);
  if (offset == HADDR_UNDEF) h5_fail(where + ": no file offset (storage not allocated)");
  return uint64_t(offset);
}

Dims File::shape(const std::string& obj) const {
  const auto guard = enter_hdf5();
  Handle dset = impl_->open_dataset(obj);
  return impl_->shape(dset, obj);
}

template <class T>
std::vector<T> File::read(const std::string& obj) const {
  const auto guard = enter_hdf5();
  Handle dset = impl_->open_dataset(obj);
  impl_->require_numeric(dset, obj, TypeOf<T>::name);
  std::vector<T> out(numel(impl_->shape(dset, obj)));
  if (!out.empty())
    check(H5Dread(dset, TypeOf<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
          strcat(impl_->path, ": cannot read ", obj, " as ", TypeOf<T>::name));
  return out;
}

template <class T>
void File::read_into(const std::string& obj, T* out, size_t n) const {
  const auto guard = enter_hdf5();
  Handle dset = impl_->open_dataset(obj);
  impl_->require_numeric(dset, obj, TypeOf<T>::name);
  const Dims dims = impl_->shape(dset, obj);
  if (numel(dims) != n)
    fail(strcat(impl_->path, ": ", obj, " ", dims_text(dims), " has ", numel(dims),
                " elements, the buffer holds ", n));
  if (n > 0)
    check(H5Dread(dset, TypeOf<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out),
          strcat(impl_->path, ": cannot read ", obj, " as ", TypeOf<T>::name));
}

template <class T>
void File::read_rows(const std::string& obj, uint64_t row0, uint64_t nrows, T* out) const {
  const auto guard = enter_hdf5();
  Handle dset = impl_->open_dataset(obj);
  impl_->require_numeric(dset, obj, TypeOf<T>::name);
  const Dims dims = impl_->shape(dset, obj);
  if (dims.empty()) fail(strcat(impl_->path, ": ", obj, " is a scalar, it has no rows"));
  if (row0 > dims[0] || nrows > dims[0] - row0)
    fail(strcat(impl_->path, ": rows [", row0, ", ", row0 + nrows, ") of ", obj, " ",
                dims_text(dims), " are out of range"));
  if (nrows == 0 || numel(dims) == 0) return;
  const std::string where = strcat(impl_->path, ": rows [", row0, ", ", row0 + nrows, ") of ", obj);
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = row0;
  count[0] = nrows;
  Handle fspace = checked(H5Dget_space(dset), H5Sclose, where);
  check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
        where + ": selection");
  Handle mspace = checked(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
                          H5Sclose, where + ": memory space");
  check(H5Dread(dset, TypeOf<T>::mem(), mspace, fspace, H5P_DEFAULT, out),
        where + ": cannot read as " + TypeOf<T>::name);
}

void File::write_virtual_float(const std::string& obj, const Dims& dims, const std::vector<VirtualPiece>& pieces) {
  const auto guard = enter_hdf5();
  const std::string where = strcat(impl_->path, ": virtual dataset ", obj, " ", dims_text(dims));
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  Handle vspace = checked(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr), H5Sclose,
                          where + ": dataspace");
  Handle dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate(dataset)");
  for (const VirtualPiece& p : pieces) {
    if (p.start.size() != dims.size() || p.count.size() != dims.size())
      fail(strcat(where, ": a piece has ", p.start.size(), " dimensions"));
    const uint64_t n = numel(p.count);
    if (n == 0) continue;
    if (p.src_offset > p.src_len || n > p.src_len - p.src_offset)
      fail(strcat(where, ": piece [", p.src_offset, ", ", p.src_offset + n, ") exceeds ", p.src_dataset, " of ",
                  p.src_len));
    std::vector<hsize_t> vs(p.start.begin(), p.start.end()), vc(p.count.begin(), p.count.end());
    check(H5Sselect_hyperslab(vspace, H5S_SELECT_SET, vs.data(), nullptr, vc.data(), nullptr),
          where + ": virtual selection");
    const hsize_t src_len = p.src_len, src_off = p.src_offset, src_n = n;
    Handle sspace = checked(H5Screate_simple(1, &src_len, nullptr), H5Sclose, where + ": source dataspace");
    check(H5Sselect_hyperslab(sspace, H5S_SELECT_SET, &src_off, nullptr, &src_n, nullptr),
          where + ": source selection");
    check(H5Pset_virtual(dcpl, vspace, p.src_file.c_str(), p.src_dataset.c_str(), sspace),
          where + ": mapping from " + p.src_file);
  }
  check(H5Sselect_all(vspace), where + ": selection");
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate(link)");
  check(H5Pset_create_intermediate_group(lcpl, 1), "H5Pset_create_intermediate_group");
  Handle dset = checked(H5Dcreate2(impl_->id(), obj.c_str(), H5T_IEEE_F32LE, vspace, lcpl, dcpl, H5P_DEFAULT),
                        H5Dclose, where + ": cannot create");
}

bool is_hdf5_file(const std::string& path) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;  // a FIFO would block the open
  std::ifstream in(path, std::ios::binary);
  char head[8];
  if (!in.read(head, 8)) return false;
  return std::memcmp(head, kSignature, 8) == 0;
}

#define LT_H5_INSTANTIATE(T)                                                               \
  template void File::write<T>(const std::string&, const Dims&, const T*, bool);          \
  template uint64_t File::reserve<T>(const std::string&, const Dims&);                    \
  template std::vector<T> File::read<T>(const std::string&) const;                        \
  template void File::read_into<T>(const std::string&, T*, size_t) const;                 \
  template void File::read_rows<T>(const std::string&, uint64_t, uint64_t, T*) const;
LT_H5_INSTANTIATE(float)
LT_H5_INSTANTIATE(double)
LT_H5_INSTANTIATE(int32_t)
LT_H5_INSTANTIATE(int64_t)
LT_H5_INSTANTIATE(int8_t)
LT_H5_INSTANTIATE(uint8_t)
LT_H5_INSTANTIATE(uint16_t)
LT_H5_INSTANTIATE(uint64_t)
#undef LT_H5_INSTANTIATE

void start_library() {
  const auto guard = enter_hdf5();  // H5dont_atexit, then the first call into the library starts it
  H5open();
}

}  // namespace lt::h5
