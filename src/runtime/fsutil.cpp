// File-system helpers. publish_file is the one place that implements "write under a temporary
// name, fsync, rename, fsync the directory": the rename is atomic on POSIX file systems, and the
// two fsyncs make the new name and its contents survive a crash in that order.
#include "llamatrain/fsutil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "llamatrain/error.h"

namespace lt {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

// fsync a path opened read-only (works for files and, on Linux, directories).
void fsync_path(const std::string& path, bool is_dir) {
  int fd = ::open(path.c_str(), O_RDONLY | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) fail(strcat(path, ": cannot open for fsync (", errno_text(), ")"));
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  // Some file systems (e.g. certain network mounts) refuse fsync on directories; the rename has
  // still happened, so only a failing file fsync is an error.
  if (rc != 0 && !is_dir) fail(strcat(path, ": fsync failed (", std::strerror(saved), ")"));
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(strcat(path, ": cannot open (", errno_text(), ")"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(strcat(path, ": read error"));
  return ss.str();
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) fail(strcat(path, ": cannot stat (", errno_text(), ")"));
  return static_cast<uint64_t>(st.st_size);
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string temp_path_for(const std::string& path) {
  return strcat(path, ".tmp.", static_cast<long>(::getpid()));
}

void publish_file(const std::string& tmp, const std::string& final_path) {
  fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
    fail(strcat(final_path, ": cannot rename ", tmp, " onto it (", errno_text(), ")"));
  std::string dir = std::filesystem::path(final_path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir, true);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(strcat(tmp, ": cannot create (", errno_text(), ")"));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  int saved = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    saved = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    fail(strcat(tmp, ": write failed (", std::strerror(saved), ")"));
  }
  try {
    publish_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) fail(strcat(path, ": cannot create directory (", ec.message(), ")"));
}

void check_writable_dir(const std::string& dir, const std::string& option) {
  const std::string d = dir.empty() ? std::string(".") : dir;
  std::error_code ec;
  if (std::filesystem::exists(d, ec) && !std::filesystem::is_directory(d, ec))
    fail(strcat(option, " ", d, ": exists and is not a directory"));
  std::filesystem::create_directories(d, ec);
  if (ec) fail(strcat(option, " ", d, ": cannot create the directory (", ec.message(), ")"));
  // Permissions alone do not tell (root, ACLs, read-only mounts, full disks): create a file.
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string probe = strcat(d, "/.llamatrain-write-test.", host, ".", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail(strcat(option, " ", d, ": cannot write in the directory (", std::strerror(errno), ")"));
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) fail(strcat(option, " ", d, ": cannot write in the directory (", std::strerror(write_errno), ")"));
}

void check_writable_file(const std::string& path, const std::string& option) {
  check_writable_dir(std::filesystem::path(path).parent_path().string(), option);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  if (std::filesystem::is_directory(path, ec)) fail(strcat(option, " ", path, ": is a directory"));
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) fail(strcat(option, " ", path, ": cannot write (", errno_text(), ")"));
  ::close(fd);
}

TempFile::~TempFile() {
  if (!path.empty()) std::remove(path.c_str());
}

}  // namespace lt
