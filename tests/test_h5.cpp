// lt::h5::File: round trips of every element type (plain and compressed), attributes of every
// kind including fixed-length strings written by other tools, and the error messages.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <thread>
#include <utility>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using lt::testing::error_of;
using lt::testing::scratch_dir;



template <class T>
std::vector<T> ramp(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>((i * 37 + 5) % 251);
  return v;
}

template <class T>
void round_trip(lt::h5::File& w, const std::string& name, const lt::h5::Dims& dims, bool compress) {
  size_t n = 1;
  for (auto d : dims) n *= d;
  auto v = ramp<T>(n);
  w.write(name, dims, v.data(), compress);
}

template <class T>
void check_round_trip(const lt::h5::File& r, const std::string& name, const lt::h5::Dims& dims) {
  size_t n = 1;
  for (auto d : dims) n *= d;
  EXPECT_EQ(r.shape(name), dims) << name;
  EXPECT_EQ(r.read<T>(name), ramp<T>(n)) << name;
  std::vector<T> into(n);
  r.read_into(name, into.data(), n);
  EXPECT_EQ(into, ramp<T>(n)) << name;
}

}  // namespace

TEST(H5, RoundTripEveryType) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "t.h5").string();
  const lt::h5::Dims d2 = {7, 13}, d3 = {3, 4, 5}, d1 = {1000};
  {
    auto w = lt::h5::File::create(path);
    for (bool c : {false, true}) {
      const std::string g = c ? "/z" : "/p";
      round_trip<float>(w, g + "/f32", d2, c);
      round_trip<double>(w, g + "/f64", d3, c);
      round_trip<int32_t>(w, g + "/i32", d1, c);
      round_trip<int64_t>(w, g + "/i64", d2, c);
      round_trip<uint8_t>(w, g + "/u8", d3, c);
      round_trip<uint16_t>(w, g + "/u16", d1, c);
      round_trip<uint64_t>(w, g + "/deep/er/u64", d2, c);
      round_trip<int32_t>(w, g + "/empty", {0, 5}, c);
    }
    round_trip<double>(w, "/scalar", {}, false);
    w.close();
  }
  EXPECT_TRUE(lt::h5::is_hdf5_file(path));
  auto r = lt::h5::File::open_read(path);
  for (const std::string g : {"/p", "/z"}) {
    check_round_trip<float>(r, g + "/f32", d2);
    check_round_trip<double>(r, g + "/f64", d3);
    check_round_trip<int32_t>(r, g + "/i32", d1);
    check_round_trip<int64_t>(r, g + "/i64", d2);
    check_round_trip<uint8_t>(r, g + "/u8", d3);
    check_round_trip<uint16_t>(r, g + "/u16", d1);
    check_round_trip<uint64_t>(r, g + "/deep/er/u64", d2);
    EXPECT_EQ(r.shape(g + "/empty"), (lt::h5::Dims{0, 5}));
    EXPECT_TRUE(r.read<int32_t>(g + "/empty").empty());
  }
  EXPECT_EQ(r.shape("/scalar"), lt::h5::Dims{});
  EXPECT_EQ(r.read<double>("/scalar"), std::vector<double>{5.0});
  EXPECT_EQ(r.list("/"), (std::vector<std::string>{"p", "scalar", "z"}));
  EXPECT_EQ(r.list("/z"), (std::vector<std::string>{"deep", "empty", "f32", "f64", "i32", "i64", "u16", "u8"}));
  EXPECT_TRUE(r.exists("/z/deep/er/u64"));
  EXPECT_FALSE(r.exists("/z/deep/nope/u64"));
  EXPECT_FALSE(r.exists("/q"));
  fs::remove_all(dir);
}

TEST(H5, CompressionShrinksAndConverts) {
  const fs::path dir = scratch_dir();
  const std::string plain = (dir / "plain.h5").string(), packed = (dir / "packed.h5").string();
  std::vector<int32_t> tokens(200000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 300);
  for (const auto& [p, c] : {std::pair{plain, false}, std::pair{packed, true}}) {
    auto w = lt::h5::File::create(p);
    w.write("/tokens", {2000, 100}, tokens.data(), c);
    w.close();
  }
  EXPECT_LT(lt::file_size(packed) * 4, lt::file_size(plain));
  auto r = lt::h5::File::open_read(packed);
  // Numeric conversion through the memory type: int32 on disk, read as double and int64.
  const auto as_double = r.read<double>("/tokens");
  const auto as_i64 = r.read<int64_t>("/tokens");
  ASSERT_EQ(as_double.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); i += 997) {
    EXPECT_EQ(as_double[i], static_cast<double>(tokens[i]));
    EXPECT_EQ(as_i64[i], tokens[i]);
  }
  // Row reads across chunk boundaries.
  std::vector<int32_t> rows(3 * 100);
  r.read_rows("/tokens", 1998, 2, rows.data());
  EXPECT_EQ(rows[0], tokens[199800]);
  EXPECT_EQ(rows[199], tokens[199999]);
  r.read_rows("/tokens", 17, 3, rows.data());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), tokens.begin() + 1700));
  EXPECT_NE(error_of([&] { r.read_rows("/tokens", 1999, 2, rows.data()); })
                .find("rows [1999, 2001) of /tokens (2000, 100) are out of range"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.read_into("/tokens", rows.data(), rows.size()); })
                .find("has 200000 elements, the buffer holds 300"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(H5, Attributes) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "a.h5").string();
  const std::string utf8 = "llamatrain \xC3\xA9t\xC3\xA9 \xF0\x9F\xA6\x99";
  {
    auto w = lt::h5::File::create(path);
    std::vector<float> x = {1, 2, 3};
    w.write("/g/x", {3}, x.data());
    w.create_group("/empty/group");
    w.write_attr("/", "name", utf8);
    w.write_attr("/", "blank", std::string());
    w.write_attr("/", "count", int64_t{-1234567890123});
    w.write_attr("/", "lr", 3.0e-4);
    w.write_attr("/g/x", "unit", std::string("tokens"));
    w.write_attr("/empty/group", "n", int64_t{7});
    w.write_attr("/g", "swap", int64_t{1});
    w.write_attr("/g", "swap", std::string("now a string"));  // replaced, type changes
    w.close();
  }
  auto r = lt::h5::File::open_read(path);
  EXPECT_EQ(r.read_attr_string("/", "name"), utf8);
  EXPECT_EQ(r.read_attr_string("/", "blank"), "");
  EXPECT_EQ(r.read_attr_int("/", "count"), -1234567890123);
  EXPECT_EQ(r.read_attr_double("/", "lr"), 3.0e-4);
  EXPECT_EQ(r.read_attr_double("/", "count"), -1234567890123.0);  // integers read as doubles
  EXPECT_EQ(r.read_attr_string("/g/x", "unit"), "tokens");
  EXPECT_EQ(r.read_attr_int("/empty/group", "n"), 7);
  EXPECT_EQ(r.read_attr_string("/g", "swap"), "now a string");
  EXPECT_TRUE(r.has_attr("/", "lr"));
  EXPECT_FALSE(r.has_attr("/", "nope"));
  EXPECT_TRUE(r.exists("/empty/group"));
  EXPECT_TRUE(r.list("/empty/group").empty());

  EXPECT_EQ(error_of([&] { r.read_attr_int("/g/x", "missing"); }),
            path + ": /g/x has no attribute missing");
  EXPECT_EQ(error_of([&] { r.read_attr_string("/", "count"); }),
            path + ": attribute count of / is an integer, expected a string");
  EXPECT_EQ(error_of([&] { r.read_attr_int("/", "lr"); }),
            path + ": attribute lr of / is a float, expected an integer");
  EXPECT_EQ(error_of([&] { r.has_attr("/nowhere", "x"); }), path + ": no object /nowhere");
  EXPECT_EQ(error_of([&] { r.read<float>("/g/nothing"); }), path + ": no object /g/nothing");
  EXPECT_EQ(error_of([&] { r.shape("/g"); }), path + ": /g is not a dataset");
  fs::remove_all(dir);
}

TEST(H5, FixedLengthStringAttributes) {
  // Other tools (h5py with numpy bytes, MATLAB, C programs) write fixed-length strings; write
  // them with the C API directly and read them back through the wrapper.
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "fixed.h5").string();
  {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t space = H5Screate(H5S_SCALAR);
    auto put = [&](const char* name, const char* bytes, size_t size, H5T_str_t pad, H5T_cset_t cset) {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, size);
      H5Tset_strpad(t, pad);
      H5Tset_cset(t, cset);
      hid_t a = H5Acreate2(f, name, t, space, H5P_DEFAULT, H5P_DEFAULT);
      ASSERT_GE(a, 0);
      ASSERT_GE(H5Awrite(a, t, bytes), 0);
      H5Aclose(a);
      H5Tclose(t);
    };
    put("nullpad", "abc\0\0\0\0\0", 8, H5T_STR_NULLPAD, H5T_CSET_ASCII);
    put("nullterm", "hello\0", 6, H5T_STR_NULLTERM, H5T_CSET_UTF8);
    put("spacepad", "xyz     ", 8, H5T_STR_SPACEPAD, H5T_CSET_ASCII);
    put("full", "\xC3\xA9t\xC3\xA9", 6, H5T_STR_NULLPAD, H5T_CSET_UTF8);
    H5Sclose(space);
    H5Fclose(f);
  }
  auto r = lt::h5::File::open_read(path);
  EXPECT_EQ(r.read_attr_string("/", "nullpad"), "abc");
  EXPECT_EQ(r.read_attr_string("/", "nullterm"), "hello");
  EXPECT_EQ(r.read_attr_string("/", "spacepad"), "xyz");
  EXPECT_EQ(r.read_attr_string("/", "full"), "\xC3\xA9t\xC3\xA9");
  fs::remove_all(dir);
}

TEST(H5, OverwriteDataset) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "o.h5").string();
  auto w = lt::h5::File::create(path);
  std::vector<int32_t> a = {1, 2, 3}, b = {9, 8, 7, 6};
  w.write("/x", {3}, a.data());
  w.write("/x", {2, 2}, b.data(), true);
  EXPECT_EQ(w.shape("/x"), (lt::h5::Dims{2, 2}));
  EXPECT_EQ(w.read<int32_t>("/x"), b);
  w.close();
  w.close();  // idempotent
  EXPECT_NE(error_of([&] { w.exists("/x"); }).find("file is closed"), std::string::npos);
  fs::remove_all(dir);
}

TEST(H5, NotHdf5AndMissingFiles) {
  const fs::path dir = scratch_dir();
  const std::string text = (dir / "notes.txt").string();
  lt::write_file_atomic(text, "just some text, definitely not HDF5\n");
  EXPECT_FALSE(lt::h5::is_hdf5_file(text));
  EXPECT_EQ(error_of([&] { lt::h5::File::open_read(text); }), text + ": not an HDF5 file");
  const std::string missing = (dir / "missing.h5").string();
  EXPECT_FALSE(lt::h5::is_hdf5_file(missing));
  EXPECT_EQ(error_of([&] { lt::h5::File::open_read(missing); }), missing + ": cannot open (no such file)");
  // A failing HDF5 call carries the operating system's reason, when the stack has one, in its first
  // line and the library's error stack after it.
  const std::string unwritable = (dir / "no" / "dir" / "x.h5").string();
  const std::string msg = error_of([&] { lt::h5::File::create(unwritable); });
  EXPECT_EQ(msg.rfind(unwritable + ": cannot create HDF5 file (No such file or directory)\n  HDF5 #000: ", 0), 0u)
      << msg;
  // A truncated HDF5 file has the signature but cannot be opened: the stack explains why.
  const std::string good = (dir / "good.h5").string();
  {
    auto w = lt::h5::File::create(good);
    std::vector<double> v(1000, 1.0);
    w.write("/v", {1000}, v.data());
    w.close();
  }
  const std::string bytes = lt::read_file_bytes(good);
  const std::string cut = (dir / "cut.h5").string();
  lt::write_file_atomic(cut, bytes.substr(0, 100));
  const std::string cut_msg = error_of([&] { lt::h5::File::open_read(cut); });
  EXPECT_EQ(cut_msg.rfind(cut + ": cannot open HDF5 file\n  HDF5 #000", 0), 0u) << cut_msg;
  fs::remove_all(dir);
}

// reserve(): storage allocated at create time on an aligned offset, never filled by HDF5, so bytes
// written there after close() are what readers see (the checkpoint's O_DIRECT path relies on it).
TEST(H5, ReservedStorageIsAlignedAndWrittenAfterClose) {
  const std::string path = (scratch_dir() / "r.h5").string();
  const auto a = ramp<float>(3001), b = ramp<float>(5);
  uint64_t off_a = 0, off_b = 0;
  {
    auto f = lt::h5::File::create_aligned(path, 4096, 4096);
    f.write_attr("/", "note", std::string("small objects stay packed"));
    off_a = f.reserve<float>("/g/a", {3001});
    f.write("/small", {3}, b.data());
    off_b = f.reserve<float>("/b", {5});  // under the threshold: not aligned, still reserved
    EXPECT_EQ(error_of([&] { f.reserve<float>("/b", {5}); }), path + ": dataset /b (5): already exists");
    f.close();
  }
  EXPECT_EQ(off_a % 4096, 0u) << off_a;
  EXPECT_GE(lt::file_size(path), off_a + 3001 * sizeof(float)) << "close() must extend the file over the storage";
  std::FILE* out = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(out, nullptr);
  std::fseek(out, long(off_a), SEEK_SET);
  std::fwrite(a.data(), sizeof(float), a.size(), out);
  std::fseek(out, long(off_b), SEEK_SET);
  std::fwrite(b.data(), sizeof(float), b.size(), out);
  std::fclose(out);
  const auto r = lt::h5::File::open_read(path);
  EXPECT_EQ(r.read<float>("/g/a"), a);
  EXPECT_EQ(r.read<float>("/b"), b);
  EXPECT_EQ(r.read<float>("/small"), std::vector<float>(b.begin(), b.begin() + 3));
}

TEST(H5, MoveKeepsTheFileOpen) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "m.h5").string();
  auto a = lt::h5::File::create(path);
  lt::h5::File b = std::move(a);
  std::vector<uint8_t> v = {1, 2};
  b.write("/v", {2}, v.data());
  b.close();
  EXPECT_EQ(lt::h5::File::open_read(path).read<uint8_t>("/v"), v);
  fs::remove_all(dir);
}

TEST(H5, ConcurrentUseFromThreads) {
  // The library is not thread-safe; the wrapper serializes calls, so files used from several
  // threads at once (checkpoint writer + data loader) stay intact.
  const fs::path dir = scratch_dir();
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const std::string path = (dir / lt::strcat("f", t, "_", i, ".h5")).string();
        std::vector<int64_t> v(5000);
        std::iota(v.begin(), v.end(), t * 100000 + i);
        auto w = lt::h5::File::create(path);
        w.write("/g/v", {50, 100}, v.data(), true);
        w.write_attr("/g/v", "t", int64_t{t});
        w.close();
        auto r = lt::h5::File::open_read(path);
        if (r.read<int64_t>("/g/v") == v && r.read_attr_int("/g/v", "t") == t) ++good;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(good.load(), 80);
  fs::remove_all(dir);
}

namespace {

// The HDF5 class and byte size of attribute `name` of the root group.
std::pair<H5T_class_t, size_t> root_attr_type(const std::string& path, const char* name) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  const hid_t t = H5Aget_type(a);
  const std::pair<H5T_class_t, size_t> out = {H5Tget_class(t), H5Tget_size(t)};
  H5Tclose(t), H5Aclose(a), H5Fclose(f);
  return out;
}

// The output of a shell command ("" when it fails to start).
std::string shell_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    pclose(p);
  }
  return out;
}

}  // namespace

// Issue 14 §5: a float attribute is a float64 holding the decimal the float was written as, so
// h5py and h5dump show 1e-05 where the float itself shows as 9.99999974737875e-06.
TEST(H5, FloatAttributesAreStoredAsTheirShortestDecimal) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "f.h5").string();
  const std::vector<std::pair<float, double>> cases = {
      {1e-5f, 1e-5}, {1e-6f, 1e-6}, {3e-4f, 3e-4}, {0.95f, 0.95}, {10000.f, 10000.0}, {0.f, 0.0},
      {-2.5e-3f, -2.5e-3}, {0.1f, 0.1},
      // The smallest normal float needs 8 digits; 2^24 + 1 is no float and rounds to 2^24.
      {1.17549435e-38f, 1.1754944e-38}, {16777217.f, 16777216.0}};
  {
    auto w = lt::h5::File::create(path);
    for (size_t i = 0; i < cases.size(); ++i) w.write_attr("/", "x" + std::to_string(i), cases[i].first);
    w.write_attr("/", "inf", std::numeric_limits<float>::infinity());
    w.close();
  }
  auto r = lt::h5::File::open_read(path);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    EXPECT_EQ(r.read_attr_double("/", name), cases[i].second) << name;
    EXPECT_EQ(float(r.read_attr_double("/", name)), cases[i].first) << name;  // the float comes back
    EXPECT_EQ(root_attr_type(path, name.c_str()), std::make_pair(H5T_FLOAT, size_t(8))) << name;
  }
  EXPECT_EQ(r.read_attr_double("/", "inf"), std::numeric_limits<double>::infinity());
  if (std::system("command -v h5dump >/dev/null 2>&1") == 0) {
    // h5dump prints 6 digits by default, which would hide the difference; with 15 the float
    // itself would print as 9.99999974737875e-06.
    const std::string dump = shell_output("h5dump -m %.15g -a /x0 '" + path + "'");
    EXPECT_NE(dump.find("H5T_IEEE_F64LE"), std::string::npos) << dump;
    EXPECT_NE(dump.find("(0): 1e-05\n"), std::string::npos) << dump;
  }
  fs::remove_all(dir);
}

// Lists are 1-D attributes (an empty one has the null dataspace); a scalar reads as one element.
TEST(H5, ListAttributes) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "l.h5").string();
  {
    auto w = lt::h5::File::create(path);
    w.write_attr_ints("/", "split", {3, 1, -2, int64_t(1) << 40});
    w.write_attr_ints("/", "none", {});
    w.write_attr_strings("/", "names", {"rank-00000.h5", "", "\xC3\xA9t\xC3\xA9"});
    w.write_attr_strings("/", "no_names", {});
    w.write_attr("/", "one", int64_t{7});
    w.write_attr("/", "word", std::string("w"));
    w.close();
  }
  auto r = lt::h5::File::open_read(path);
  EXPECT_EQ(r.read_attr_ints("/", "split"), (std::vector<int64_t>{3, 1, -2, int64_t(1) << 40}));
  EXPECT_TRUE(r.read_attr_ints("/", "none").empty());
  EXPECT_EQ(r.read_attr_strings("/", "names"), (std::vector<std::string>{"rank-00000.h5", "", "\xC3\xA9t\xC3\xA9"}));
  EXPECT_TRUE(r.read_attr_strings("/", "no_names").empty());
  EXPECT_EQ(r.read_attr_ints("/", "one"), (std::vector<int64_t>{7}));
  EXPECT_EQ(r.read_attr_strings("/", "word"), (std::vector<std::string>{"w"}));
  EXPECT_EQ(error_of([&] { r.read_attr_ints("/", "names"); }),
            path + ": attribute names of / is a string, expected a list of integers");
  EXPECT_EQ(error_of([&] { r.read_attr_int("/", "split"); }), path + ": attribute split of / holds 4 values, expected 1");
  fs::remove_all(dir);
}

// String datasets hold one string per row (variable-length UTF-8; fixed-length ones written by
// other tools read too); enum datasets carry their member names.
TEST(H5, StringAndEnumDatasets) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "s.h5").string();
  const std::vector<std::string> ids = {"21645374", "a b\nc", "", "\xF0\x9F\xA6\x99"};
  {
    auto w = lt::h5::File::create(path);
    w.write_strings("/ids", ids);
    w.write_strings("/g/none", {});
    w.write_enum("/label", {0, 2, -1, 1}, {{"none", -1}, {"yes", 0}, {"no", 1}, {"maybe", 2}});
    std::vector<int8_t> codes = {0, 1};
    w.write("/codes", {2}, codes.data());
    w.close();
  }
  {  // A fixed-length, NUL-padded string dataset as h5py writes numpy bytes.
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 4);
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    const hsize_t n = 2;
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(f, "/fixed", t, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, "abcdx\0\0\0"), 0);
    H5Dclose(d), H5Sclose(space), H5Tclose(t), H5Fclose(f);
  }
  auto r = lt::h5::File::open_read(path);
  EXPECT_EQ(r.kind("/ids"), lt::h5::File::Kind::kString);
  EXPECT_EQ(r.read_strings("/ids"), ids);
  EXPECT_TRUE(r.read_strings("/g/none").empty());
  EXPECT_EQ(r.read_strings("/fixed"), (std::vector<std::string>{"abcd", "x"}));
  EXPECT_EQ(r.kind("/label"), lt::h5::File::Kind::kEnum);
  EXPECT_EQ(r.kind("/codes"), lt::h5::File::Kind::kInteger);
  lt::h5::File::EnumMembers members;
  EXPECT_EQ(r.read_enum("/label", &members), (std::vector<int64_t>{0, 2, -1, 1}));
  EXPECT_EQ(members, (lt::h5::File::EnumMembers{{"none", -1}, {"yes", 0}, {"no", 1}, {"maybe", 2}}));
  EXPECT_EQ(error_of([&] { r.read_strings("/codes"); }), path + ": dataset /codes is an integer dataset, expected strings");
  EXPECT_EQ(error_of([&] { r.read_enum("/ids", &members); }), path + ": dataset /ids is a string dataset, expected an enum");
  if (std::system("command -v h5dump >/dev/null 2>&1") == 0) {
    const std::string label = shell_output("h5dump -d /label '" + path + "'");
    EXPECT_NE(label.find("yes, maybe, none, no"), std::string::npos) << label;
    const std::string dump = shell_output("h5dump -d /ids '" + path + "'");
    EXPECT_NE(dump.find("\"21645374\""), std::string::npos) << dump;
  }
  fs::remove_all(dir);
}
