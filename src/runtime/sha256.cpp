// SHA-256 as specified in FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 6.2): 512-bit blocks,
// big-endian words, 64 rounds. Written here so the project needs no crypto library; it is used
// for provenance (tokenizer and source hashes) and checkpoint checksums, not for security.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"

namespace lt {
namespace {

// FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first
// 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Incremental hasher: feed bytes with update(), then finish() pads and yields the digest.
class Sha256 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_bytes_ += n;
    if (fill_ > 0) {
      size_t take = std::min(n, sizeof(block_) - fill_);
      std::memcpy(block_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ < sizeof(block_)) return;
      compress(block_);
      fill_ = 0;
    }
    for (; n >= 64; p += 64, n -= 64) compress(p);
    std::memcpy(block_, p, n);
    fill_ = n;
  }

  std::string finish() {
    // 5.1.1: append bit '1', zeros up to 56 mod 64 bytes, then the length in bits (big-endian).
    const uint64_t bits = total_bytes_ * 8;
    const uint8_t one = 0x80;
    update(&one, 1);
    const uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    static const char* kHex = "0123456789abcdef";
    std::string hex(64, '0');
    for (int i = 0; i < 8; ++i)
      for (int b = 0; b < 4; ++b) {
        uint8_t byte = static_cast<uint8_t>(h_[i] >> (24 - 8 * b));
        hex[i * 8 + b * 2] = kHex[byte >> 4];
        hex[i * 8 + b * 2 + 1] = kHex[byte & 15];
      }
    return hex;
  }

 private:
  // 6.2.2: message schedule W[0..63] and the 64-round compression of one block.
  void compress(const uint8_t* p) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = (uint32_t(p[4 * t]) << 24) | (uint32_t(p[4 * t + 1]) << 16) |
             (uint32_t(p[4 * t + 2]) << 8) | uint32_t(p[4 * t + 3]);
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
             h = h_[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = h + big_s1 + ch + kRound[t] + w[t];
      uint32_t big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      uint32_t t2 = big_s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  // 5.3.3: initial hash value H(0), fractional parts of the square roots of the first 8 primes.
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64];
  size_t fill_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace

std::string sha256_hex(const void* data, size_t n) {
  Sha256 sha;
  sha.update(data, n);
  return sha.finish();
}

std::string sha256_file(const std::string& path) {
  // Streamed in 1 MiB pieces so multi-GB checkpoints and corpora need no whole-file buffer.
  refuse_special_file(path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(strcat(path, ": cannot open (", std::strerror(errno), ")"));
  Sha256 sha;
  std::vector<char> buf(size_t(1) << 20);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) sha.update(buf.data(), got);
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) fail(strcat(path, ": read error"));
  return sha.finish();
}

}  // namespace lt
