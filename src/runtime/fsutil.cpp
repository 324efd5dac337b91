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

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe; bash's <(...) makes one: write the text to a file)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// stat(path) for an input, or the "not found" / "cannot stat" error.
struct stat stat_input(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) fail(strcat(path, ": ", what, " not found"));
    fail(strcat(path, ": ", what, ": cannot stat (", errno_text(), ")"));
  }
  return st;
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  const std::string w = what.empty() ? "input" : what;
  const struct stat st = stat_input(path, w);
  if (!S_ISREG(st.st_mode)) fail(strcat(path, ": ", w, " is ", file_kind(st.st_mode), ", not a regular file"));
}

void refuse_special_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(strcat(path, ": ", what.empty() ? "input" : what, " is ", file_kind(st.st_mode), ", not a regular file"));
}

void require_directory(const std::string& path, const std::string& what) {
  const std::string w = what.empty() ? "input" : what;
  const struct stat st = stat_input(path, w);
  if (!S_ISDIR(st.st_mode)) fail(strcat(path, ": ", w, " is ", file_kind(st.st_mode), ", not a directory"));
}

std::vector<NamedPath>& noted_inputs() {
  static std::vector<NamedPath> inputs;
  return inputs;
}

void note_input(const NamedPath& input) { noted_inputs().push_back(input); }

void refuse_output_over_input(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& given) {
  std::vector<NamedPath> inputs = given;
  inputs.insert(inputs.end(), noted_inputs().begin(), noted_inputs().end());
  for (const NamedPath& out : outputs) {
    struct stat o;
    if (out.path.empty() || ::stat(out.path.c_str(), &o) != 0) continue;
    for (const NamedPath& in : inputs) {
      struct stat i;
      if (in.path.empty() || ::stat(in.path.c_str(), &i) != 0) continue;
      if (o.st_dev == i.st_dev && o.st_ino == i.st_ino)
        fail(strcat(out.option, " ", out.path, ": is the input ", in.option, " ", in.path, " (the same ",
                    S_ISDIR(o.st_mode) ? "directory" : "file", "); writing it would destroy the input: choose another path"));
    }
  }
}

std::string read_file_bytes(const std::string& path) {
  refuse_special_file(path);
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
