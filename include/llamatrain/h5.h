// RAII access to HDF5 files (HighFive-style): every handle is owned by an object whose
// destructor never throws; a failing HDF5 call becomes an lt::Error that names the file, the
// object and carries the HDF5 error stack.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lt::h5 {

using Dims = std::vector<uint64_t>;

// Starts the HDF5 library; MpiSession calls it before MPI_Init. A parallel HDF5 (Debian's
// hdf5-openmpi) started after MPI_Init hooks its shutdown to MPI_Finalize (an attribute of
// MPI_COMM_SELF), and that shutdown closes again a file whose close failed (a full disk), which
// crashed MPI_Finalize after the run had said what it saved. Started before, it has no such hook,
// and its exit handler is off as well: every file we open is closed by its owner.
void start_library();

class File {
 public:
  // Creates (truncating) a file for writing. Callers publish it atomically: create under
  // temp_path_for(final), close, publish_file(tmp, final).
  static File create(const std::string& path);
  // The same, with every dataset of at least `align_min_bytes` placed at a file offset that is a
  // multiple of `alignment` (H5Pset_alignment): such a dataset's bytes can then be written with
  // O_DIRECT, which needs block-aligned offsets.
  static File create_aligned(const std::string& path, uint64_t align_min_bytes, uint64_t alignment);
  // Opens an existing file read-only. Throws "<path>: not an HDF5 file" etc.
  static File open_read(const std::string& path);
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();
  void close();  // flushes and closes; throws on failure (the destructor swallows errors)

  const std::string& path() const;
  // Object paths are absolute ("/train/tokens"); intermediate groups are created on write.
  bool exists(const std::string& obj) const;
  void create_group(const std::string& group);
  std::vector<std::string> list(const std::string& group) const;  // member names, sorted

  // Attributes on a group or dataset ("/" for the root).
  void write_attr(const std::string& obj, const std::string& name, const std::string& value);
  void write_attr(const std::string& obj, const std::string& name, int64_t value);
  void write_attr(const std::string& obj, const std::string& name, double value);
  // A float is stored as a float64 attribute holding the shortest decimal that reads back as the
  // same float, i.e. the value as the user wrote it: 1e-5f becomes 1e-5 (h5dump prints 1e-05),
  // not 9.99999974737875e-06. read_attr_double() then gives it back exactly.
  void write_attr(const std::string& obj, const std::string& name, float value);
  // 1-D attributes: a list of integers (int64) or of strings (variable-length UTF-8).
  void write_attr_ints(const std::string& obj, const std::string& name, const std::vector<int64_t>& values);
  void write_attr_strings(const std::string& obj, const std::string& name, const std::vector<std::string>& values);
  bool has_attr(const std::string& obj, const std::string& name) const;
  // Readers throw "<path>: <obj> has no attribute <name>" or a type mismatch message.
  std::string read_attr_string(const std::string& obj, const std::string& name) const;
  int64_t read_attr_int(const std::string& obj, const std::string& name) const;
  double read_attr_double(const std::string& obj, const std::string& name) const;
  // Lists: a 1-D (or scalar, read as one element) attribute of integers / strings.
  std::vector<int64_t> read_attr_ints(const std::string& obj, const std::string& name) const;
  std::vector<std::string> read_attr_strings(const std::string& obj, const std::string& name) const;

  // What a dataset holds, for readers that accept an older layout.
  enum class Kind { kInteger, kFloat, kString, kEnum, kOther };
  Kind kind(const std::string& obj) const;

  // A 1-D dataset of strings, one per row, variable-length UTF-8 (h5py's string_dtype()), so
  // h5dump and h5py show one string per row. read_strings() also reads fixed-length strings.
  void write_strings(const std::string& obj, const std::vector<std::string>& values);
  std::vector<std::string> read_strings(const std::string& obj) const;
  // A 1-D dataset of an HDF5 enumerated type over int8: every value is one of the named members,
  // so h5dump and h5py print names ("yes") instead of codes. read_enum() returns the values and
  // the file's own members (their names say what each value means).
  using EnumMembers = std::vector<std::pair<std::string, int64_t>>;
  void write_enum(const std::string& obj, const std::vector<int8_t>& values, const EnumMembers& members);
  std::vector<int64_t> read_enum(const std::string& obj, EnumMembers* members) const;

  // Datasets of float, double, int8_t, int32_t, int64_t, uint8_t, uint16_t, uint64_t (chunked + deflate when `compress`).
  template <class T>
  void write(const std::string& obj, const Dims& dims, const T* data, bool compress = false);
  // Creates a contiguous dataset whose storage is allocated in the file now and never filled, and
  // returns the byte offset of its raw data in the file. The caller writes numel(dims) elements
  // of T there, little-endian (the file type), after close(); until then they read as garbage.
  template <class T>
  uint64_t reserve(const std::string& obj, const Dims& dims);
  Dims shape(const std::string& obj) const;
  // Reads the whole dataset, converting to T (HDF5 converts numeric types).
  template <class T>
  std::vector<T> read(const std::string& obj) const;
  // Reads into out, which must hold exactly numel(shape(obj)) elements (else throws).
  template <class T>
  void read_into(const std::string& obj, T* out, size_t n) const;
  // A virtual dataset of float32 `dims` assembled from 1-D float32 source datasets in other files
  // (HDF5 VDS): each piece maps source elements [src_offset, src_offset + numel(count)) of
  // `src_file`:`src_dataset` (src_len elements in all) onto the block at `start` of extent
  // `count`, in row-major order. A relative src_file is found beside this file when read.
  struct VirtualPiece {
    std::string src_file, src_dataset;
    uint64_t src_len = 0, src_offset = 0;
    Dims start, count;
  };
  void write_virtual_float(const std::string& obj, const Dims& dims, const std::vector<VirtualPiece>& pieces);
  // Reads rows [row0, row0+nrows) of a dataset whose first dimension is rows.
  template <class T>
  void read_rows(const std::string& obj, uint64_t row0, uint64_t nrows, T* out) const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True when the file starts with the HDF5 signature (\x89HDF\r\n\x1a\n at offset 0).
bool is_hdf5_file(const std::string& path);

}  // namespace lt::h5
