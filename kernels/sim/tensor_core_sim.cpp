// Emulation of mma.sync m16n8k16 bf16, ldmatrix and cp.async for the simulator; the model and the
// checks are described in tensor_core_sim.h, the fragment layouts in kernels/tensor_core.cuh.
#include "tensor_core_sim.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "cuda_sim.h"
#include "race_sim.h"

namespace lt::sim::tc {

namespace {

[[noreturn]] void failf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void failf(const char* fmt, ...) {
  char msg[320];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_kernel(msg);
}

float bf16_bits_to_float(uint32_t bits16) {
  const uint32_t f = bits16 << 16;
  float v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}
// Element `half` (0: low 16 bits, 1: high) of a .b32 register.
uint32_t half_of(uint32_t reg, int half) { return (reg >> (16 * half)) & 0xffffu; }

int linear_thread() {
  return static_cast<int>(thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z));
}

}  // namespace

void mma_m16n8k16_bf16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  struct Fragments {
    uint32_t a[4];
    uint32_t b[2];
  };
  Fragments mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  Fragments all[kWarpSize];
  warp_gather("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", &mine, sizeof mine, all);

  // This lane's four outputs are rows group and group + 8, columns 2 tig and 2 tig + 1 of D. Their
  // operands are read from the lanes that hold them, by the PTX ISA layout (tensor_core.cuh):
  // a_i of lane 4 g + t is A[g + 8 ((i >> 1) & 1)][2 t + (i & 1) + 8 (i >> 2)], in register i / 2,
  // half i % 2; b_i of lane 4 g + t is B[2 t + (i & 1) + 8 (i >> 1)][g].
  const int lane = lane_id();
  const int group = lane >> 2, tig = lane % 4;
  float A[2][16], B[2][16];  // A[h][k] = A[group + 8 h][k]; B[j][k] = B[k][2 tig + j]
  for (int k = 0; k < 16; ++k) {
    const int holder = (k & 7) >> 1, half = k & 1, upper_k = (k & 8) ? 1 : 0;
    for (int h = 0; h < 2; ++h)
      A[h][k] = bf16_bits_to_float(half_of(all[group * 4 + holder].a[h | (upper_k << 1)], half));
    for (int j = 0; j < 2; ++j) B[j][k] = bf16_bits_to_float(half_of(all[(tig * 2 + j) * 4 + holder].b[upper_k], half));
  }
  float out[4];
  for (int i = 0; i < 4; ++i) {  // d_i is D[group + 8 (i >> 1)][2 tig + (i & 1)]
    const float* a_row = A[i >> 1];
    const float* b_col = B[i & 1];
    float acc = c[i];
    // bf16 x bf16 is exact in fp32 (8-bit significands), so only the additions round.
    for (int k = 0; k < 16; ++k) acc += a_row[k] * b_col[k];
    out[i] = acc;
  }
  std::memcpy(d, out, sizeof out);  // d may alias c
}

void ldmatrix(uint32_t* r, int n_matrices, bool trans, const void* row_address) {
  static const char* const kNames[2][3] = {
      {"ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
       "ldmatrix.sync.aligned.m8n8.x4.shared.b16"},
      {"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
       "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"}};
  const int which = n_matrices == 1 ? 0 : (n_matrices == 2 ? 1 : 2);
  const char* name = kNames[trans ? 1 : 0][which];
  const auto mine = reinterpret_cast<uintptr_t>(row_address);
  // The rows are read by the warp; each is charged to the lane that gives its address.
  if (lane_id() < 8 * n_matrices) race::note_read(row_address, 16, __builtin_return_address(0));
  uintptr_t rows[kWarpSize];
  warp_gather(name, &mine, sizeof mine, rows);
  // Lanes 8j..8j+7 give the rows of matrix j; the others' addresses are not used.
  for (int l = 0; l < 8 * n_matrices; ++l) {
    if (rows[l] % 16 != 0)
      failf("%s: row address 0x%" PRIxPTR " given by lane %d is not 16-byte aligned", name, rows[l], l);
  }
  const int lane = lane_id();
  const int group = lane >> 2, tig = lane % 4;
  auto element = [&](int matrix, int row, int col) {  // element (row, col) of 8x8 matrix `matrix`
    uint16_t v;
    std::memcpy(&v, reinterpret_cast<const unsigned char*>(rows[8 * matrix + row]) + 2 * col, sizeof v);
    return static_cast<uint32_t>(v);
  };
  for (int j = 0; j < n_matrices; ++j) {
    const uint32_t lo = trans ? element(j, tig * 2, group) : element(j, group, tig * 2);
    const uint32_t hi = trans ? element(j, tig * 2 + 1, group) : element(j, group, tig * 2 + 1);
    r[j] = lo | (hi << 16);
  }
}

// ---- cp.async -------------------------------------------------------------------------------------
namespace {

struct PendingCopy {
  unsigned char* dst;
  const unsigned char* src;
  int bytes, src_bytes;
  const char* instruction;
  unsigned char src_at_issue[16];
  unsigned char dst_at_issue[16];
};

// One simulated thread's copies: those not committed yet, then the committed groups oldest first.
struct ThreadCopies {
  uint64_t block = 0;  // block_serial() of the block these belong to
  std::vector<PendingCopy> uncommitted;
  std::deque<std::vector<PendingCopy>> groups;
};

// Indexed by the thread's linear index in its block; entries from an earlier block are discarded
// when first touched (their copies were never waited for, so they are never performed).
thread_local std::vector<ThreadCopies> t_copies;

ThreadCopies& own_copies() {
  const size_t t = static_cast<size_t>(linear_thread());
  if (t_copies.size() <= t) t_copies.resize(t + 1);
  ThreadCopies& q = t_copies[t];
  if (q.block != block_serial()) {
    q.block = block_serial();
    q.uncommitted.clear();
    q.groups.clear();
  }
  return q;
}

void perform(const PendingCopy& c, const void* pc) {
  if (std::memcmp(c.src, c.src_at_issue, c.src_bytes) != 0)
    failf("%s: source 0x%" PRIxPTR " changed between the cp.async and the wait_group that completes it "
          "(a race: the device may copy either value)",
          c.instruction, reinterpret_cast<uintptr_t>(c.src));
  if (std::memcmp(c.dst, c.dst_at_issue, c.bytes) != 0)
    failf("%s: destination 0x%" PRIxPTR " was written while the cp.async to it was in flight (a race)",
          c.instruction, reinterpret_cast<uintptr_t>(c.dst));
  race::note_write(c.dst, c.bytes, pc);
  std::memcpy(c.dst, c.src_at_issue, c.src_bytes);
  std::memset(c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
}

}  // namespace

void cp_async(void* dst, const void* src, int bytes, int src_bytes, const char* instruction) {
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d % bytes != 0)
    failf("%s: shared destination 0x%" PRIxPTR " is not %d-byte aligned", instruction, d, bytes);
  if (s % bytes != 0) failf("%s: global source 0x%" PRIxPTR " is not %d-byte aligned", instruction, s, bytes);
  if (src_bytes < 0 || src_bytes > bytes)
    failf("%s: src-size %d is outside 0..%d", instruction, src_bytes, bytes);
  PendingCopy c;
  c.dst = static_cast<unsigned char*>(dst);
  c.src = static_cast<const unsigned char*>(src);
  c.bytes = bytes;
  c.src_bytes = src_bytes;
  c.instruction = instruction;
  race::note_read(src, src_bytes, __builtin_return_address(0));
  // The device may write the destination at any moment between the issue and the wait, so the
  // write is noted at both ends: here it conflicts with another thread's access in the issuing
  // barrier interval (a buffer refilled while a warp still reads it), at the wait (perform) with
  // those of the waiting interval. Accesses in intervals strictly between the two are not seen.
  race::note_write(dst, bytes, __builtin_return_address(0));
  std::memcpy(c.src_at_issue, c.src, src_bytes);
  std::memcpy(c.dst_at_issue, c.dst, bytes);
  own_copies().uncommitted.push_back(c);
}

void cp_async_commit() {
  ThreadCopies& q = own_copies();
  q.groups.push_back(std::move(q.uncommitted));
  q.uncommitted.clear();
}

void cp_async_wait(int n) {
  ThreadCopies& q = own_copies();
  while (q.groups.size() > static_cast<size_t>(n)) {
    for (const PendingCopy& c : q.groups.front()) perform(c, __builtin_return_address(0));
    q.groups.pop_front();
  }
}

}  // namespace lt::sim::tc
