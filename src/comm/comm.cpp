#include "llamatrain/comm.h"

#include <algorithm>
#include <cstring>

#include "llamatrain/runtime.h"

namespace lt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "fp64";
    case DType::kI64: return "int64";
  }
  return "?";
}

void Comm::reduce_scatter_v_sum(void* buf, const std::vector<size_t>& counts, DType t) {
  LT_CHECK(counts.size() == size_t(size()), "reduce_scatter_v_sum: ", counts.size(), " counts for ", size(), " ranks");
  auto* p = static_cast<char*>(buf);
  for (int r = 0; r < size(); ++r) {
    if (counts[size_t(r)] > 0) reduce_sum(p, counts[size_t(r)], t, r);
    p += counts[size_t(r)] * dtype_size(t);
  }
}

void Comm::allgather_v(void* buf, const std::vector<size_t>& counts, DType t) {
  LT_CHECK(counts.size() == size_t(size()), "allgather_v: ", counts.size(), " counts for ", size(), " ranks");
  auto* p = static_cast<char*>(buf);
  for (int r = 0; r < size(); ++r) {
    const size_t bytes = counts[size_t(r)] * dtype_size(t);
    if (bytes > 0) broadcast(p, bytes, r);
    p += bytes;
  }
}

namespace {

// A Comm's blocking calls, made at start.
class BlockingAtStart final : public NonblockingCollectives {
 public:
  explicit BlockingAtStart(Comm& comm) : comm_(comm) {}
  uint64_t start_allreduce_sum(void* buf, size_t count, DType t) override {
    comm_.allreduce_sum(buf, count, t);
    return 0;
  }
  uint64_t start_reduce_sum(void* buf, size_t count, DType t, int root) override {
    comm_.reduce_sum(buf, count, t, root);
    return 0;
  }
  uint64_t start_allgather(void* buf, size_t shard_count, DType t) override {
    comm_.allgather(buf, shard_count, t);
    return 0;
  }
  uint64_t start_allgather_v(void* buf, const std::vector<size_t>& counts, DType t) override {
    comm_.allgather_v(buf, counts, t);
    return 0;
  }
  bool done(uint64_t) override { return true; }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<NonblockingCollectives> Comm::make_nonblocking() { return std::make_unique<BlockingAtStart>(*this); }

std::vector<double> Comm::allgather_values(const std::vector<double>& values) {
  const size_t n = values.size();
  std::vector<double> out(n * size_t(size()), 0.0);
  std::memcpy(out.data() + n * size_t(rank()), values.data(), n * sizeof(double));
  allgather(out.data(), n, DType::kF64);
  return out;
}

std::vector<std::string> Comm::allgather_strings(const std::string& s) {
  // A fixed record per rank: the length, then the bytes, in int64 words.
  constexpr size_t kWords = 1 + kMaxGatheredString / sizeof(int64_t);
  std::vector<int64_t> buf(kWords * size_t(size()), 0);
  int64_t* mine = buf.data() + kWords * size_t(rank());
  const size_t n = std::min(s.size(), kMaxGatheredString);
  mine[0] = int64_t(n);
  std::memcpy(mine + 1, s.data(), n);
  allgather(buf.data(), kWords, DType::kI64);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r) {
    const int64_t* rec = buf.data() + kWords * size_t(r);
    out.emplace_back(reinterpret_cast<const char*>(rec + 1), size_t(rec[0]));
  }
  return out;
}

namespace {

// One rank: every collective is the identity.
class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }
  void allreduce_sum(void*, size_t, DType) override {}
  void reduce_scatter_sum(void*, size_t, DType) override {}
  void reduce_sum(void*, size_t, DType, int root) override {
    LT_CHECK(root == 0, "reduce to rank ", root, " in a one-rank world");
  }
  void allgather(void*, size_t, DType) override {}
  void broadcast(void*, size_t, int root) override {
    LT_CHECK(root == 0, "broadcast from rank ", root, " in a one-rank world");
  }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Comm> make_mpi_world_comm();  // mpi_comm.cpp

std::unique_ptr<Comm> make_self_comm() { return std::make_unique<SelfComm>(); }

Comm& world_comm() {
  static std::unique_ptr<Comm> comm = world().mpi ? make_mpi_world_comm() : make_self_comm();
  return *comm;
}

void agree_on_error(Comm& comm, const std::string* local_error) {
  // (failed?, rank) of every rank, then the message of the lowest failing rank.
  const std::vector<double> flags = comm.allgather_values({local_error ? 1.0 : 0.0});
  int first = -1, failed = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (flags[size_t(r)] == 0.0) continue;
    ++failed;
    if (first < 0) first = r;
  }
  if (first < 0) return;
  std::vector<int64_t> len = {comm.rank() == first ? int64_t(local_error->size()) : 0};
  comm.broadcast(len.data(), sizeof(int64_t), first);
  std::string what(size_t(len[0]), '\0');
  if (comm.rank() == first) what = *local_error;
  if (!what.empty()) comm.broadcast(what.data(), what.size(), first);
  if (failed < comm.size()) what = strcat("[rank ", first, "] ", what);
  throw CollectiveError(what);
}

}  // namespace lt
