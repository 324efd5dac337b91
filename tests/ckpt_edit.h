// Edits of a written checkpoint in place, as a user with h5py, a byte editor or a failing disk
// would make them, for the tests of damage detection and of the older formats.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "llamatrain/checkpoint.h"
#include "llamatrain/h5.h"
#include "test_util.h"

namespace lt::testing {

// Overwrites attribute `name` of the root group of `file` with `bytes` of memory type `type`.
inline void overwrite_root_attr(const std::string& file, const char* name, hid_t type, const void* bytes) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(a, 0) << file << " " << name;
  EXPECT_GE(H5Awrite(a, type, bytes), 0) << file << " " << name;
  H5Aclose(a);
  H5Fclose(f);
}
inline void set_root_attr(const std::string& file, const char* name, int64_t value) {
  overwrite_root_attr(file, name, H5T_NATIVE_INT64, &value);
}
inline void set_root_attr(const std::string& file, const char* name, const std::vector<int64_t>& values) {
  overwrite_root_attr(file, name, H5T_NATIVE_INT64, values.data());  // the same length as before
}
inline void set_root_attr(const std::string& file, const char* name, const std::string& value) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const char* p = value.c_str();
  overwrite_root_attr(file, name, type, &p);
  H5Tclose(type);
}

// Rewrites the line of `name` in dir/checksums.xxh3 to the file's present hash, so that only
// the cross-checks can tell the edit.
inline void resum_in_manifest(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/checksums.xxh3";
  std::ifstream in(path);
  std::string text;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("XXH3 (" + name + ") = ", 0) == 0) {
      const std::string bytes = slurp(dir + "/" + name);
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(xxh3_64(bytes.data(), bytes.size())));
      line = "XXH3 (" + name + ") = " + hex;
    }
    text += line + "\n";
  }
  std::ofstream(path, std::ios::trunc) << text;
}

// A rank file of format 3 with the piece sums of formats 1 and 2 (checksum64), as those wrote it.
inline void use_checksum64(const std::string& rank_file) {
  std::vector<std::vector<uint64_t>> sums;
  const char* arrays[3] = {"weights", "adam_m", "adam_v"};
  {
    const auto f = h5::File::open_read(rank_file);
    const auto count = f.read<uint64_t>("/piece_count");
    for (const char* a : arrays) {
      const auto data = f.read<float>(std::string("/") + a);
      sums.emplace_back();
      size_t at = 0;
      for (uint64_t c : count) sums.back().push_back(checksum64(data.data() + at, c * sizeof(float))), at += c;
    }
  }
  const hid_t f = H5Fopen(rank_file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << rank_file;
  for (int a = 0; a < 3; ++a) {
    const hid_t d = H5Dopen2(f, (std::string("/checksum_") + arrays[a]).c_str(), H5P_DEFAULT);
    ASSERT_GE(d, 0);
    EXPECT_GE(H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, sums[size_t(a)].data()), 0);
    H5Dclose(d);
  }
  H5Fclose(f);
}

}  // namespace lt::testing
