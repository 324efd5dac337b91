#include "ckpt/checkpoint_sums.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "llamatrain/checkpoint.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt {

uint64_t xxh3_64(const void* data, size_t n) { return XXH3_64bits(data, n); }

namespace ckpt {

namespace {

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

// Feeds bytes [begin, end) of the open file fd into the hash.
void hash_from_file(XXH3_state_t* st, int fd, const std::string& path, uint64_t begin, uint64_t end) {
  std::vector<char> buf(size_t(1) << 20);
  while (begin < end) {
    const ssize_t r = ::pread(fd, buf.data(), size_t(std::min<uint64_t>(buf.size(), end - begin)), off_t(begin));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail(strcat(path, ": cannot read to checksum (", r < 0 ? std::strerror(errno) : "file shorter than expected", ")"));
    XXH3_64bits_update(st, buf.data(), size_t(r));
    begin += uint64_t(r);
  }
}

}  // namespace

std::string xxh3_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

uint64_t xxh3_file(const std::string& path, std::vector<RawRegion> from_memory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(strcat(path, ": cannot open to checksum (", std::strerror(errno), ")"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(strcat(path, ": cannot stat (", std::strerror(errno), ")"));
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) fail("XXH3: cannot create a hash state");
  std::sort(from_memory.begin(), from_memory.end(),
            [](const RawRegion& a, const RawRegion& b) { return a.offset < b.offset; });
  uint64_t at = 0;
  for (const RawRegion& r : from_memory) {
    hash_from_file(state.get(), fd, path, at, r.offset);
    XXH3_64bits_update(state.get(), r.data, size_t(r.bytes));
    at = r.offset + r.bytes;
  }
  hash_from_file(state.get(), fd, path, at, std::max<uint64_t>(at, uint64_t(st.st_size)));
  return XXH3_64bits_digest(state.get());
}

void write_manifest(const std::string& dir, const std::vector<std::pair<std::string, uint64_t>>& sums) {
  std::string text;
  for (const auto& [name, h] : sums) text += strcat("XXH3 (", name, ") = ", xxh3_hex(h), "\n");
  const std::string path = dir + "/" + kManifest;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(strcat(path, ": cannot create (", std::strerror(errno), ")"));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) fail(strcat(path, ": write failed (", std::strerror(err), ")"));
  fsync_path(path, false);
}

bool has_manifest(const std::string& dir) { return file_exists(dir + "/" + kManifest); }

std::map<std::string, std::string> read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
  std::ifstream in(path);
  if (!in) fail(strcat(path, ": missing (a checkpoint of format 3 lists its files' XXH3 sums there)"));
  std::map<std::string, std::string> out;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const size_t open = line.find(" ("), close = line.rfind(") = ");
    if (line.rfind("XXH3 (", 0) != 0 || open == std::string::npos || close == std::string::npos || close < open ||
        line.size() != close + 4 + 16)
      fail(strcat(path, ":", line_no, ": not an 'XXH3 (<file>) = <16 hex digits>' line"));
    out[line.substr(open + 2, close - open - 2)] = line.substr(close + 4);
  }
  return out;
}

void verify_file(const std::string& dir, const std::map<std::string, std::string>& manifest, const std::string& name) {
  const auto it = manifest.find(name);
  if (it == manifest.end()) fail(strcat(dir, "/", kManifest, ": no sum for ", name, " (damaged checkpoint)"));
  const std::string actual = xxh3_hex(xxh3_file(dir + "/" + name));
  if (actual != it->second)
    fail(strcat(dir, "/", name, ": XXH3 ", actual, " differs from ", kManifest, "'s ", it->second,
                " (damaged checkpoint)"));
}

}  // namespace ckpt
}  // namespace lt
