// The MPI comm layer, run by CTest under `mpirun -np 2` and `-np 3` (shards that do not divide
// evenly). Every rank runs every test; values are chosen so that the expected sums are exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/error.h"
#include "llamatrain/runtime.h"
#include "llamatrain/zero.h"

namespace {

using lt::Comm;
using lt::DType;

Comm& comm() { return lt::world_comm(); }

TEST(CommMpi, IsTheMpiWorld) {
  EXPECT_EQ(comm().name(), "mpi");
  EXPECT_EQ(comm().size(), lt::world().size);
  EXPECT_EQ(comm().rank(), lt::world().rank);
  EXPECT_GE(comm().size(), 2) << "run this binary under mpirun -np 2 or more";
}

TEST(CommMpi, AllreduceSumEveryType) {
  const int W = comm().size(), r = comm().rank();
  const size_t n = 1001;
  std::vector<float> f(n);
  std::vector<double> d(n);
  std::vector<int64_t> i(n);
  for (size_t k = 0; k < n; ++k) f[k] = float(r + 1) * float(k), d[k] = 0.5 * (r + 1) * double(k), i[k] = int64_t(k) << r;
  comm().allreduce_sum(f.data(), n);
  comm().allreduce_sum(d.data(), n);
  comm().allreduce_sum(i.data(), n);
  const double ranks_sum = W * (W + 1) / 2.0;
  int64_t pow_sum = (int64_t(1) << W) - 1;
  for (size_t k = 0; k < n; ++k) {
    ASSERT_EQ(f[k], float(ranks_sum * double(k))) << "fp32 element " << k;
    ASSERT_EQ(d[k], 0.5 * ranks_sum * double(k)) << "fp64 element " << k;
    ASSERT_EQ(i[k], int64_t(k) * pow_sum) << "int64 element " << k;
  }
}

// bf16 is a 2-byte MPI type with our own sum; small integers are exact in bf16.
TEST(CommMpi, AllreduceSumBf16) {
  const int W = comm().size(), r = comm().rank();
  std::vector<uint16_t> h(37);
  for (size_t k = 0; k < h.size(); ++k) {
    const float x = float(int(k) - 18 + r);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h[k] = uint16_t(bits >> 16);  // exact: small integers have 8 significant bits at most
  }
  comm().allreduce_sum(h.data(), h.size(), DType::kBF16);
  for (size_t k = 0; k < h.size(); ++k) {
    const uint32_t bits = uint32_t(h[k]) << 16;
    float x;
    std::memcpy(&x, &bits, 4);
    const float expect = float(W * (int(k) - 18) + W * (W - 1) / 2);
    ASSERT_EQ(x, expect) << "bf16 element " << k;
  }
}

TEST(CommMpi, ReduceScatterLeavesEachRankItsSummedShard) {
  const int W = comm().size(), r = comm().rank();
  for (size_t shard : {size_t(1), size_t(7), size_t(1000)}) {
    std::vector<float> buf(shard * size_t(W));
    for (size_t k = 0; k < buf.size(); ++k) buf[k] = float(k) + 1000.0f * float(r);
    comm().reduce_scatter_sum(buf.data(), shard, DType::kF32);
    for (size_t k = 0; k < shard; ++k) {
      const size_t g = size_t(r) * shard + k;
      ASSERT_EQ(buf[g], float(W) * float(g) + 1000.0f * float(W * (W - 1) / 2)) << "shard " << shard << " element " << g;
    }
  }
}

// reduce_sum to every root: the root gets the sum, the other ranks keep their own values (the
// device optimizer's reduce of each bucket piece to its owner relies on both).
TEST(CommMpi, ReduceSumToEveryRootLeavesTheOthersUnchanged) {
  const int W = comm().size(), r = comm().rank();
  for (int root = 0; root < W; ++root) {
    std::vector<float> buf(37);
    for (size_t k = 0; k < buf.size(); ++k) buf[k] = float(k) + 100.0f * float(r);
    comm().reduce_sum(buf.data(), buf.size(), DType::kF32, root);
    for (size_t k = 0; k < buf.size(); ++k) {
      const float want = r == root ? float(W) * float(k) + 100.0f * float(W * (W - 1) / 2) : float(k) + 100.0f * float(r);
      ASSERT_EQ(buf[k], want) << "root " << root << " element " << k;
    }
  }
}

TEST(CommMpi, AllgatherFillsEveryShard) {
  const int W = comm().size(), r = comm().rank();
  const size_t shard = 13;
  std::vector<double> buf(shard * size_t(W), -1.0);
  for (size_t k = 0; k < shard; ++k) buf[size_t(r) * shard + k] = 100.0 * r + double(k);
  comm().allgather(buf.data(), shard, DType::kF64);
  for (int o = 0; o < W; ++o)
    for (size_t k = 0; k < shard; ++k) ASSERT_EQ(buf[size_t(o) * shard + k], 100.0 * o + double(k));
  const std::vector<double> v = comm().allgather_values({double(r), -double(r)});
  ASSERT_EQ(v.size(), size_t(2 * W));
  for (int o = 0; o < W; ++o) {
    EXPECT_EQ(v[size_t(2 * o)], o);
    EXPECT_EQ(v[size_t(2 * o + 1)], -o);
  }
}

// Uneven pieces, one of them empty (a ZeRO-3 block that lies inside fewer than all shards):
// reduce_scatter_v_sum leaves each rank its piece's sum, allgather_v hands every piece to all.
TEST(CommMpi, UnevenPiecesReduceScatterAndAllgather) {
  const int W = comm().size(), r = comm().rank();
  std::vector<size_t> counts, begin;
  size_t total = 0;
  for (int o = 0; o < W; ++o) {
    counts.push_back(o == 1 ? 0 : size_t(5 + 3 * o));  // rank 1's piece is empty
    begin.push_back(total);
    total += counts.back();
  }
  std::vector<float> g(total);
  for (size_t k = 0; k < total; ++k) g[k] = float(k) * float(r + 1);
  comm().reduce_scatter_v_sum(g.data(), counts, DType::kF32);
  for (size_t k = begin[size_t(r)]; k < begin[size_t(r)] + counts[size_t(r)]; ++k)
    ASSERT_EQ(g[k], float(k) * float(W * (W + 1) / 2)) << "rank " << r << " element " << k;
  std::vector<double> p(total, -1.0);
  for (size_t k = begin[size_t(r)]; k < begin[size_t(r)] + counts[size_t(r)]; ++k) p[k] = 1000.0 * r + double(k);
  comm().allgather_v(p.data(), counts, DType::kF64);
  for (int o = 0; o < W; ++o)
    for (size_t k = begin[size_t(o)]; k < begin[size_t(o)] + counts[size_t(o)]; ++k)
      ASSERT_EQ(p[k], 1000.0 * o + double(k)) << "piece " << o << " element " << k;
}

TEST(CommMpi, BroadcastFromEveryRoot) {
  const int W = comm().size(), r = comm().rank();
  for (int root = 0; root < W; ++root) {
    std::string s(11, char('a' + r));
    comm().broadcast(s.data(), s.size(), root);
    EXPECT_EQ(s, std::string(11, char('a' + root)));
  }
  comm().barrier();
}

// The ZeRO pieces with a real world: shards of a buffer that W does not divide, then the
// reduce-scatter + allgather round trip a stage-2 step performs.
TEST(CommMpi, ShardedRoundTripOnAPaddedBuffer) {
  const int W = comm().size(), r = comm().rank();
  const lt::ShardLayout s(1003, W);
  ASSERT_EQ(s.padded % size_t(W), 0u);
  std::vector<float> g(s.padded, 0.f);
  for (size_t k = 0; k < s.n; ++k) g[k] = float(k % 17) * float(r + 1);
  comm().reduce_scatter_sum(g.data(), s.shard, DType::kF32);
  std::vector<float> p(s.padded, 0.f);
  for (size_t k = s.begin(r); k < s.end(r); ++k) p[k] = g[k];
  comm().allgather(p.data(), s.shard, DType::kF32);
  for (size_t k = 0; k < s.n; ++k) ASSERT_EQ(p[k], float(k % 17) * float(W * (W + 1) / 2)) << "element " << k;
  for (size_t k = s.n; k < s.padded; ++k) ASSERT_EQ(p[k], 0.f) << "padding element " << k;
}

// The nonblocking collectives (cuda-sim's device communicator): each kind lands the same values as
// its blocking form; they run on a communicator of their own, so a rank may make a blocking call
// of the Comm before or after starting them (here the last rank makes a blocking all-reduce before,
// the others after) without pairing the two.
TEST(CommMpi, NonblockingCollectivesLandWhileBlockingOnesRun) {
  const int W = comm().size(), r = comm().rank();
  const auto nb = comm().make_nonblocking();
  double blocking = r;
  if (r == W - 1) blocking = comm().allreduce_sum(blocking);
  std::vector<float> sum(1001), to_root(77);
  for (size_t k = 0; k < sum.size(); ++k) sum[k] = float(r + 1) * float(k);
  for (size_t k = 0; k < to_root.size(); ++k) to_root[k] = float(r + 1) + float(k);
  const size_t shard = 13;
  std::vector<uint16_t> gathered(shard * size_t(W), 0xffff);  // bf16 bit patterns
  for (size_t k = 0; k < shard; ++k) gathered[size_t(r) * shard + k] = uint16_t(100 * r + int(k));
  std::vector<size_t> counts;
  for (int o = 0; o < W; ++o) counts.push_back(o == 1 ? 0 : size_t(3 + o));
  std::vector<uint16_t> pieces(5 + 4 * size_t(W), 0xffff);
  size_t at = 0;
  for (int o = 0; o < r; ++o) at += counts[size_t(o)];
  for (size_t k = 0; k < counts[size_t(r)]; ++k) pieces[at + k] = uint16_t(1000 * r + int(k));
  const int root = W - 1;
  const std::vector<uint64_t> tickets = {
      nb->start_allreduce_sum(sum.data(), sum.size(), DType::kF32),
      nb->start_reduce_sum(to_root.data(), to_root.size(), DType::kF32, root),
      nb->start_allgather(gathered.data(), shard, DType::kBF16),
      nb->start_allgather_v(pieces.data(), counts, DType::kBF16)};
  if (r != W - 1) blocking = comm().allreduce_sum(blocking);
  for (uint64_t t : tickets)
    while (!nb->done(t)) {
    }
  EXPECT_EQ(blocking, W * (W - 1) / 2.0);
  const float ranks_sum = float(W * (W + 1) / 2);
  for (size_t k = 0; k < sum.size(); ++k) ASSERT_EQ(sum[k], ranks_sum * float(k)) << "element " << k;
  for (size_t k = 0; k < to_root.size(); ++k)
    ASSERT_EQ(to_root[k], r == root ? ranks_sum + float(W) * float(k) : float(r + 1) + float(k)) << "element " << k;
  for (int o = 0; o < W; ++o)
    for (size_t k = 0; k < shard; ++k) ASSERT_EQ(gathered[size_t(o) * shard + k], uint16_t(100 * o + int(k)));
  at = 0;
  for (int o = 0; o < W; ++o)
    for (size_t k = 0; k < counts[size_t(o)]; ++k, ++at) ASSERT_EQ(pieces[at], uint16_t(1000 * o + int(k)));
}

TEST(CommMpi, AgreeTurnsOneRanksErrorIntoEveryRanks) {
  const int W = comm().size(), r = comm().rank();
  // Nobody fails: nothing thrown.
  EXPECT_NO_THROW(lt::agree(comm(), [] {}));
  // Only the last rank fails: every rank throws its message, tagged with the rank.
  try {
    lt::agree(comm(), [&] {
      if (r == W - 1) lt::fail("bad input on the last rank");
    });
    ADD_FAILURE() << "no error";
  } catch (const lt::CollectiveError& e) {
    EXPECT_EQ(std::string(e.what()), "[rank " + std::to_string(W - 1) + "] bad input on the last rank");
  }
  // Every rank fails: the lowest rank's message, untagged.
  try {
    lt::agree(comm(), [&] { lt::fail("rank " + std::to_string(r) + " says no"); });
    ADD_FAILURE() << "no error";
  } catch (const lt::CollectiveError& e) {
    EXPECT_EQ(std::string(e.what()), "rank 0 says no");
  }
}

}  // namespace

int main(int argc, char** argv) {
  lt::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // One report: the other ranks run the same tests silently (their failures still fail the job).
  if (lt::world().rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  return rc;
}
