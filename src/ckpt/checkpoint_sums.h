// The checksums of a checkpoint of format 3 (docs/formats.md, "Checksums"): XXH3-64 (seed 0, from
// libxxhash), the hash `xxhsum -H3` computes, over
//   * each piece of a rank file's arrays (its float32 bytes as stored, little-endian), which a load
//     checks for exactly what it reads, and
//   * every file of the checkpoint as a whole, listed in D/step-N/checksums.xxh3 in xxhsum's own
//     format ("XXH3 (<file>) = <16 hex digits>"), so `xxhsum -c checksums.xxh3` run in the
//     checkpoint's directory checks every byte with a standard tool. The line of checkpoint.h5
//     covers everything a resume trusts (step, epoch, seed, world size, ZeRO stage, split, data
//     identity, model config, rank files): a load checks it before it reads an attribute.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lt::ckpt {

constexpr const char* kManifest = "checksums.xxh3";

// A hash as xxhsum prints it: 16 lowercase hex digits, most significant first.
std::string xxh3_hex(uint64_t h);

// Bytes of one array and where they lie in a file.
struct RawRegion {
  const char* data = nullptr;
  uint64_t bytes = 0, offset = 0;
};

// XXH3-64 of the whole file at `path`; the bytes at each region are taken from memory (the arrays
// just written there), the rest is read from the file.
uint64_t xxh3_file(const std::string& path, std::vector<RawRegion> from_memory = {});

// Writes dir/checksums.xxh3 (one line per file, in order) and fsyncs it.
void write_manifest(const std::string& dir, const std::vector<std::pair<std::string, uint64_t>>& sums);
// Whether dir has a checksums.xxh3.
bool has_manifest(const std::string& dir);
// The sums of dir/checksums.xxh3 by file name (throws lt::Error when it is missing or malformed).
std::map<std::string, std::string> read_manifest(const std::string& dir);
// Throws lt::Error "<dir>/<name>: XXH3 <actual> differs from checksums.xxh3's <expected> (damaged
// checkpoint)" unless the file's hash is the one the manifest lists.
void verify_file(const std::string& dir, const std::map<std::string, std::string>& manifest, const std::string& name);

}  // namespace lt::ckpt
