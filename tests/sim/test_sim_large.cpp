// Index arithmetic at Llama-2-70B sizes (issue 16, item 8): kernels launched on tensors beyond 2^31
// elements, held in reserved address space that is mostly never touched, with only the last
// blocks of each launch run (lt::sim::set_block_subset). The rows those blocks own are filled with
// data; the result must equal, bit for bit, the same kernel on a compact copy of those rows. 9 GiB
// of inaccessible address space lie before every buffer, so a 32-bit offset that wrapped negative
// faults instead of writing somewhere plausible (proven by a kernel that indexes with int).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <csignal>
#include <cstring>
#include <random>
#include <vector>

#include "attention.cuh"
#include "crossentropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "rmsnorm.cuh"
#include "swiglu.cuh"

namespace {

constexpr uint64_t kGuardBytes = 9ull << 30;  // > 2^31 floats: any wrapped int offset lands here
constexpr uint16_t kSentinel = 0xffff;        // a NaN in bf16: "not written"

// n elements of T in address space reserved with MAP_NORESERVE, after an inaccessible guard.
template <class T>
class Reserved {
 public:
  explicit Reserved(size_t n) : bytes_(kGuardBytes + n * sizeof(T)) {
    base_ = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED) throw std::runtime_error("cannot reserve address space");
    if (mprotect(static_cast<char*>(base_) + kGuardBytes, n * sizeof(T), PROT_READ | PROT_WRITE) != 0)
      throw std::runtime_error("mprotect failed");
    data_ = reinterpret_cast<T*>(static_cast<char*>(base_) + kGuardBytes);
  }
  ~Reserved() { munmap(base_, bytes_); }
  Reserved(const Reserved&) = delete;
  Reserved& operator=(const Reserved&) = delete;
  T* data() { return data_; }

 private:
  size_t bytes_;
  void* base_;
  T* data_;
};

// Runs only the last `blocks` blocks of every launch in its scope.
struct LastBlocks {
  explicit LastBlocks(uint64_t blocks) { lt::sim::set_block_subset(0, blocks); }
  ~LastBlocks() { lt::sim::set_block_subset(0, 0); }
};

std::vector<__nv_bfloat16> random_bf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(d(rng));
  return v;
}
void fill_sentinel(__nv_bfloat16* p, size_t n) { std::memset(static_cast<void*>(p), 0xff, n * sizeof(*p)); }
uint16_t bits(__nv_bfloat16 x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return b;
}

// Every element the big run wrote equals the compact run's; at least `min_written` were written.
void expect_written_equal(const char* what, const __nv_bfloat16* big, const std::vector<__nv_bfloat16>& small,
                          size_t min_written) {
  size_t written = 0, differ = 0, first = 0;
  for (size_t i = 0; i < small.size(); ++i) {
    if (bits(big[i]) == kSentinel) continue;
    ++written;
    if (bits(big[i]) != bits(small[i]) && differ++ == 0) first = i;
  }
  std::printf("[ %s ] %zu elements written at the end of the tensor, %zu differ\n", what, written, differ);
  EXPECT_GE(written, min_written) << what;
  EXPECT_EQ(differ, 0u) << what << ": first at " << first;
}

// Llama-2-70B: dim 8192, FFN 28672, vocab 32000, 64 heads of 128 on 8 KV heads.
constexpr int kDim = 8192, kFfn = 28672, kVocab = 32000;

TEST(SimLarge, RmsnormBeyond2To31Elements) {
  const int N = 262200, R = 2;  // N * kDim = 2.148e9
  ASSERT_GT(int64_t(N) * kDim, int64_t(1) << 31);
  std::mt19937 rng(81);
  Reserved<__nv_bfloat16> x(size_t(N) * kDim), out(size_t(N) * kDim);
  const auto tail = random_bf16(size_t(R) * kDim, rng, 1.5f), w = random_bf16(kDim, rng);
  const size_t at = size_t(N - R) * kDim;
  std::memcpy(x.data() + at, tail.data(), tail.size() * 2);
  fill_sentinel(out.data() + at, tail.size());
  std::vector<float> rstd(N, 0.f), rstd_small(R);
  std::vector<__nv_bfloat16> out_small(tail.size());
  lt::cuda::RmsnormForwardParams p;
  p.out = out.data(), p.rstd = rstd.data(), p.x = x.data(), p.weight = w.data();
  p.N = N, p.C = kDim, p.x_row_stride = kDim, p.out_row_stride = kDim;
  {
    LastBlocks last(R);
    lt::cuda::rmsnorm_forward_cuda(p, nullptr);
  }
  p.out = out_small.data(), p.rstd = rstd_small.data(), p.x = tail.data(), p.N = R;
  lt::cuda::rmsnorm_forward_cuda(p, nullptr);
  expect_written_equal("rmsnorm out", out.data() + at, out_small, tail.size());
  EXPECT_EQ(std::memcmp(&rstd[N - R], rstd_small.data(), R * 4), 0);
}

TEST(SimLarge, CrossentropyBeyond2To31Logits) {
  const int N = 70000, R = 2;  // N * kVocab = 2.24e9
  std::mt19937 rng(82);
  Reserved<__nv_bfloat16> logits(size_t(N) * kVocab);
  const auto tail = random_bf16(size_t(R) * kVocab, rng, 3.f);
  std::memcpy(logits.data() + size_t(N - R) * kVocab, tail.data(), tail.size() * 2);
  std::vector<int32_t> targets(N, 0);
  targets[N - 2] = 31999, targets[N - 1] = 7;
  std::vector<float> losses(N, -1.f), lse(N, -1.f), losses_small(R), lse_small(R);
  lt::cuda::CrossentropyForwardParams p;
  p.losses = losses.data(), p.lse = lse.data(), p.logits = logits.data(), p.targets = targets.data();
  p.N = N, p.V = kVocab, p.logits_row_stride = kVocab;
  {
    LastBlocks last(R);
    lt::cuda::crossentropy_forward_cuda(p, nullptr);
  }
  p.losses = losses_small.data(), p.lse = lse_small.data(), p.logits = tail.data(), p.targets = &targets[N - R];
  p.N = R;
  lt::cuda::crossentropy_forward_cuda(p, nullptr);
  std::printf("[ crossentropy ] last rows: loss %.6g %.6g lse %.6g %.6g\n", losses[N - 2], losses[N - 1], lse[N - 2],
              lse[N - 1]);
  EXPECT_EQ(std::memcmp(&losses[N - R], losses_small.data(), R * 4), 0);
  EXPECT_EQ(std::memcmp(&lse[N - R], lse_small.data(), R * 4), 0);
}

TEST(SimLarge, EmbeddingAndSwigluBeyond2To31Elements) {
  std::mt19937 rng(83);
  {  // embedding: out (N, 8192), 2.148e9 elements
    const int N = 262200, R = 2;
    Reserved<__nv_bfloat16> table(size_t(kVocab) * kDim), out(size_t(N) * kDim);
    std::vector<int32_t> tokens(N, 0);
    tokens[N - 2] = 31999, tokens[N - 1] = 12345;
    for (int r = 0; r < R; ++r) {
      const auto row = random_bf16(kDim, rng);
      std::memcpy(table.data() + size_t(tokens[N - R + r]) * kDim, row.data(), kDim * 2);
    }
    fill_sentinel(out.data() + size_t(N - R) * kDim, size_t(R) * kDim);
    std::vector<__nv_bfloat16> out_small(size_t(R) * kDim);
    lt::cuda::EmbeddingForwardParams p;
    p.out = out.data(), p.tokens = tokens.data(), p.wte = table.data(), p.N = N, p.C = kDim;
    p.out_row_stride = kDim, p.wte_row_stride = kDim;
    {
      LastBlocks last(R);
      lt::cuda::embedding_forward_cuda(p, nullptr);
    }
    p.out = out_small.data(), p.tokens = &tokens[N - R], p.N = R;
    lt::cuda::embedding_forward_cuda(p, nullptr);
    expect_written_equal("embedding out", out.data() + size_t(N - R) * kDim, out_small, 1);
  }
  {  // swiglu: (N, 28672), 2.15e9 elements
    const int N = 75000, R = 2;
    Reserved<__nv_bfloat16> h1(size_t(N) * kFfn), h3(size_t(N) * kFfn), out(size_t(N) * kFfn);
    const auto t1 = random_bf16(size_t(R) * kFfn, rng), t3 = random_bf16(size_t(R) * kFfn, rng);
    const size_t at = size_t(N - R) * kFfn;
    std::memcpy(h1.data() + at, t1.data(), t1.size() * 2);
    std::memcpy(h3.data() + at, t3.data(), t3.size() * 2);
    fill_sentinel(out.data() + at, t1.size());
    std::vector<__nv_bfloat16> out_small(t1.size());
    lt::cuda::SwigluForwardParams p;
    p.out = out.data(), p.h1 = h1.data(), p.h3 = h3.data(), p.N = N, p.F = kFfn;
    p.out_row_stride = p.h1_row_stride = p.h3_row_stride = kFfn;
    {
      LastBlocks last(R);
      lt::cuda::swiglu_forward_cuda(p, nullptr);
    }
    p.out = out_small.data(), p.h1 = t1.data(), p.h3 = t3.data(), p.N = R;
    lt::cuda::swiglu_forward_cuda(p, nullptr);
    expect_written_equal("swiglu out", out.data() + at, out_small, 1);
  }
}

TEST(SimLarge, ResidualAddBeyond2To31Elements) {
  const size_t n = (size_t(1) << 31) + 4096 * 3 + 10;
  const size_t tail = 1 << 20;  // the last 2^20 elements hold data
  std::mt19937 rng(84);
  Reserved<__nv_bfloat16> a(n), b(n), out(n);
  const auto ta = random_bf16(tail, rng), tb = random_bf16(tail, rng);
  std::memcpy(a.data() + n - tail, ta.data(), tail * 2);
  std::memcpy(b.data() + n - tail, tb.data(), tail * 2);
  fill_sentinel(out.data() + n - tail, tail);
  {
    LastBlocks last(2);
    lt::cuda::residual_add_cuda(out.data(), a.data(), b.data(), n, nullptr);
  }
  std::vector<__nv_bfloat16> want(tail);
  for (size_t i = 0; i < tail; ++i) want[i] = __float2bfloat16(__bfloat162float(ta[i]) + __bfloat162float(tb[i]));
  // A grid-stride loop: the last two blocks own every (grid x threads)-th pair, some of them here.
  expect_written_equal("residual add", out.data() + n - tail, want, 1);
}

// Attention forward on (B 513, T 512, 64 heads of 128, 8 KV heads): q and out hold 2.15e9 elements.
// The last two blocks (query tiles 6 and 7 of head 63, batch row 512) against a batch of one.
TEST(SimLarge, AttentionForwardBeyond2To31Elements) {
  const int B = 513, T = 512, H = 64, KVH = 8, hd = 128;
  const size_t q_row = size_t(T) * H * hd, kv_row = size_t(T) * KVH * hd;
  std::mt19937 rng(85);
  Reserved<__nv_bfloat16> q(size_t(B) * q_row), k(size_t(B) * kv_row), v(size_t(B) * kv_row), out(size_t(B) * q_row);
  const auto tq = random_bf16(q_row, rng, 0.5f), tk = random_bf16(kv_row, rng, 0.5f), tv = random_bf16(kv_row, rng);
  std::memcpy(q.data() + (B - 1) * q_row, tq.data(), q_row * 2);
  std::memcpy(k.data() + (B - 1) * kv_row, tk.data(), kv_row * 2);
  std::memcpy(v.data() + (B - 1) * kv_row, tv.data(), kv_row * 2);
  fill_sentinel(out.data() + (B - 1) * q_row, q_row);
  std::vector<float> lse(size_t(B) * H * T, 0.f), lse_small(size_t(H) * T, 0.f);
  std::vector<__nv_bfloat16> out_small(q_row);
  fill_sentinel(out_small.data(), q_row);
  const auto run = [&](int batch, __nv_bfloat16* o, float* l, const __nv_bfloat16* qq, const __nv_bfloat16* kk,
                       const __nv_bfloat16* vv) {
    lt::cuda::AttentionParams p;
    p.out = {o, H * hd, hd};
    p.lse = l;
    p.q = {qq, H * hd, hd};
    p.k = {kk, KVH * hd, hd};
    p.v = {vv, KVH * hd, hd};
    p.B = batch, p.T = T, p.H = H, p.KVH = KVH, p.hd = hd;
    LastBlocks last(2);
    lt::cuda::attention_forward_cuda(p, nullptr);
  };
  run(B, out.data(), lse.data(), q.data(), k.data(), v.data());
  run(1, out_small.data(), lse_small.data(), tq.data(), tk.data(), tv.data());
  expect_written_equal("attention out", out.data() + (B - 1) * q_row, out_small, 2 * 64 * hd);
  EXPECT_EQ(std::memcmp(&lse[size_t(B - 1) * H * T], lse_small.data(), lse_small.size() * 4), 0);
}

// A kernel that computes its offset in 32 bits, as a first GPU kernel often does: at these sizes the
// offset wraps negative and the write lands in the guard, which stops the process.
__global__ void int_offset_kernel(__nv_bfloat16* x, int n_cols) {
  const int offset = static_cast<int>(int64_t(blockIdx.x) * n_cols) + static_cast<int>(threadIdx.x);
  x[offset] = __float2bfloat16(1.f);
}
__global__ void int64_offset_kernel(__nv_bfloat16* x, int n_cols) {
  x[int64_t(blockIdx.x) * n_cols + threadIdx.x] = __float2bfloat16(1.f);
}

TEST(SimLargeDeathTest, A32BitOffsetIsCaught) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  const int N = 262200;
  Reserved<__nv_bfloat16> x(size_t(N) * kDim);
  {
    LastBlocks last(1);
    lt::launch_kernel(int64_offset_kernel, dim3(N), dim3(32), 0, nullptr, x.data(), kDim);
  }
  EXPECT_EQ(__bfloat162float(x.data()[size_t(N - 1) * kDim]), 1.f);
  EXPECT_EXIT(
      {
        LastBlocks last(1);
        lt::launch_kernel(int_offset_kernel, dim3(N), dim3(32), 0, nullptr, x.data(), kDim);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
}

}  // namespace
