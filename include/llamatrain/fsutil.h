// Small file-system helpers: whole-file reads, atomic publication, SHA-256.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace lt {

// An input that must be a regular file (links followed): throws lt::Error "<path>: <what> not
// found" when it does not exist, and "<path>: <what> is a FIFO (named pipe), not a regular file"
// (a directory, a character device, ...) when it is something else, before anything opens it:
// opening a FIFO blocks until a writer comes, and /dev/zero never ends. what: e.g.
// "tokenizer file (--tokenizer)"; empty: "input".
void require_regular_file(const std::string& path, const std::string& what = "");
// The same for an input that must be a directory.
void require_directory(const std::string& path, const std::string& what = "");
// require_regular_file's second half alone: a path that exists must be a regular file (a missing
// one is left to the caller's message).
void refuse_special_file(const std::string& path, const std::string& what = "");
// An option and the path it names, for refuse_output_over_input.
struct NamedPath {
  std::string option;  // "--metrics"; for a file written beside an output: "--output (its tokenizer)"
  std::string path;
};
// Refuses, before any work, a command whose output would replace one of its inputs: the same file
// or directory by identity (device and inode, links followed), however the two paths are spelled.
// Throws lt::Error "--metrics d.h5: is the input --data d.h5 (the same file); writing it would
// destroy the input: choose another path". Outputs that do not exist yet and empty paths pass.
// The inputs noted with note_input (the --config file) are compared too.
void refuse_output_over_input(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);
// An input of the whole process, whatever the command (main notes --config).
void note_input(const NamedPath& input);
// Whole file as bytes (refuse_special_file first); throws lt::Error "<path>: cannot open (reason)".
std::string read_file_bytes(const std::string& path);
// Size in bytes; throws naming the path if it does not exist.
uint64_t file_size(const std::string& path);
bool file_exists(const std::string& path);
// A temporary name beside `path` (same directory, so rename is atomic): "<path>.tmp.<pid>".
std::string temp_path_for(const std::string& path);
// fsync the file at tmp, rename it onto final_path, fsync the directory. Throws on failure.
void publish_file(const std::string& tmp, const std::string& final_path);
// Writes `path` through a temporary file beside it: write(tmp) fills the temporary, which is then
// published atomically (publish_file). If anything throws (a full disk, a failed flush), the
// temporary is removed and the error passes on: no partial file is left under either name.
template <class Write>
void write_through_temp(const std::string& path, Write&& write) {
  const std::string tmp = temp_path_for(path);
  try {
    write(tmp);
    publish_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}
// Writes bytes to a temporary file and publishes it atomically.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a file or (is_dir) a directory; a directory fsync that the file system refuses is ignored.
void fsync_path(const std::string& path, bool is_dir);
// mkdir -p
void make_dirs(const std::string& path);
// Creates dir if missing, then creates and removes a file in it, so that a run fails at its start,
// not after hours, when its output cannot be written. Throws lt::Error
// "<option> <dir>: cannot create the directory (...)" or "...: cannot write in the directory (...)";
// an empty dir means the working directory.
void check_writable_dir(const std::string& dir, const std::string& option);
// The same for a file that will be written or appended to: its directory as above, and when the
// file exists, that it is a file this process may open for writing (it is left as it is).
void check_writable_file(const std::string& path, const std::string& option);

// A file removed when the object goes out of scope (inputs written only for a library that
// reads from a path, such as SentencePiece training). Set `path` after creating the file.
struct TempFile {
  std::string path;
  TempFile() = default;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();
};

// SHA-256 (FIPS 180-4), lowercase hex.
std::string sha256_hex(const void* data, size_t n);
inline std::string sha256_hex(const std::string& s) { return sha256_hex(s.data(), s.size()); }
std::string sha256_file(const std::string& path);

}  // namespace lt
