// File helpers and SHA-256: FIPS 180-4 / NIST example vectors plus block-boundary lengths,
// streamed file hashing, atomic writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using lt::testing::error_of;
using lt::testing::scratch_dir;

// A fresh directory per test (tests may run in parallel processes).


}  // namespace

TEST(Sha256, NistVectors) {
  EXPECT_EQ(lt::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(lt::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 448 bits: the padding no longer fits in the block, a second block is needed.
  EXPECT_EQ(lt::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(lt::sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                           "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(lt::sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, BlockBoundaryLengths) {
  // Values from Python's hashlib; 55/56 and 119/120 straddle the length-field boundary.
  const std::pair<size_t, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const auto& [n, hex] : cases) EXPECT_EQ(lt::sha256_hex(std::string(n, 'a')), hex) << n;
}

TEST(Sha256, FileMatchesBuffer) {
  const fs::path dir = scratch_dir();
  // 2.5 MiB of a non-periodic pattern: crosses the 1 MiB read buffer at an odd offset.
  std::string bytes(5 * (1 << 19) + 17, '\0');
  uint32_t x = 12345;
  for (auto& c : bytes) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  const std::string path = (dir / "blob.bin").string();
  lt::write_file_atomic(path, bytes);
  EXPECT_EQ(lt::sha256_file(path), lt::sha256_hex(bytes));
  EXPECT_EQ(lt::sha256_file(path).size(), 64u);
  EXPECT_NE(error_of([&] { lt::sha256_file(path + ".missing"); }).find(path + ".missing: cannot open"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(FsUtil, AtomicWriteAndRead) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "a.txt").string();
  EXPECT_FALSE(lt::file_exists(path));
  lt::write_file_atomic(path, std::string("hello\0world", 11));
  EXPECT_TRUE(lt::file_exists(path));
  EXPECT_EQ(lt::file_size(path), 11u);
  EXPECT_EQ(lt::read_file_bytes(path), std::string("hello\0world", 11));
  lt::write_file_atomic(path, "second");  // replaces
  EXPECT_EQ(lt::read_file_bytes(path), "second");
  // Only the published file remains: no temporary left beside it.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  fs::remove_all(dir);
}

TEST(FsUtil, TempPathIsBesideAndUnique) {
  const std::string t = lt::temp_path_for("/some/dir/x.h5");
  EXPECT_EQ(t, lt::strcat("/some/dir/x.h5.tmp.", ::getpid()));
  EXPECT_EQ(fs::path(t).parent_path(), fs::path("/some/dir"));
}

TEST(FsUtil, ErrorsNameThePath) {
  const fs::path dir = scratch_dir();
  const std::string missing = (dir / "nope.txt").string();
  EXPECT_EQ(error_of([&] { lt::read_file_bytes(missing); }),
            missing + ": cannot open (No such file or directory)");
  EXPECT_NE(error_of([&] { lt::file_size(missing); }).find(missing + ": cannot stat"), std::string::npos);
  // Writing into a directory that does not exist fails at the temporary file and names it.
  const std::string bad = (dir / "no" / "such" / "f.txt").string();
  EXPECT_NE(error_of([&] { lt::write_file_atomic(bad, "x"); }).find(lt::temp_path_for(bad)),
            std::string::npos);
  EXPECT_NE(error_of([&] { lt::publish_file(missing, (dir / "b").string()); }).find(missing),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(FsUtil, MakeDirs) {
  const fs::path dir = scratch_dir();
  const std::string nested = (dir / "a" / "b" / "c").string();
  lt::make_dirs(nested);
  EXPECT_TRUE(fs::is_directory(nested));
  lt::make_dirs(nested);  // already there: fine
  lt::write_file_atomic((dir / "file").string(), "x");
  EXPECT_NE(error_of([&] { lt::make_dirs((dir / "file" / "sub").string()); }).find("cannot create directory"),
            std::string::npos);
  fs::remove_all(dir);
}
