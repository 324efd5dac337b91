// The MPI implementation of Comm, over a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/runtime.h"

namespace lt {

namespace {

// MPI counts are int: larger transfers go in pieces of at most this many elements.
constexpr size_t kMaxCount = size_t(1) << 30;

float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, NaN kept quiet: the conversion __float2bfloat16 performs.
uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// MPI's type of t, but for bf16 (the communicator's own type).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI64: return MPI_INT64_T;
    case DType::kBF16: break;
  }
  return MPI_DATATYPE_NULL;
}

// MPI has no bf16: a 2-byte type with a user sum that accumulates in fp32 per pair.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

// Checks an MPI return code: lt::Error naming the call, the rank and MPI's message.
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  const World& w = world();
  fail(strcat(call, " failed on rank ", w.rank, "/", w.size, " (", w.host, "): ", std::string(msg, size_t(len))));
}

// MPI's nonblocking collectives on a duplicate of the communicator (see comm.h). Counts must fit
// an int (the simulator's buffers do). A ticket is the request's serial number; a completed one is
// forgotten.
class MpiNonblocking final : public NonblockingCollectives {
 public:
  MpiNonblocking(MPI_Comm parent, MPI_Datatype bf16, MPI_Op bf16_sum) : bf16_(bf16), bf16_sum_(bf16_sum) {
    check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  }
  ~MpiNonblocking() override {
    // A collective still open (a fault ends the job) keeps the communicator: freeing is left to
    // MPI_Abort. Also nothing to free once MPI is finalized.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && open_.empty()) MPI_Comm_free(&comm_);
  }
  uint64_t start_allreduce_sum(void* buf, size_t count, DType t) override {
    return add(MPI_Iallreduce(MPI_IN_PLACE, buf, fit(count), type(t), sum(t), comm_, &request_), "MPI_Iallreduce");
  }
  uint64_t start_reduce_sum(void* buf, size_t count, DType t, int root) override {
    const void* send = rank_ == root ? MPI_IN_PLACE : buf;
    return add(MPI_Ireduce(send, rank_ == root ? buf : nullptr, fit(count), type(t), sum(t), root, comm_, &request_),
               "MPI_Ireduce");
  }
  uint64_t start_allgather(void* buf, size_t shard_count, DType t) override {
    return add(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, fit(shard_count), type(t), comm_, &request_),
               "MPI_Iallgather");
  }
  uint64_t start_allgather_v(void* buf, const std::vector<size_t>& counts, DType t) override {
    // MPI reads the counts when the collective progresses, not only at start: they live with it.
    auto& [n, displ] = arrays_[next_];
    size_t at = 0;
    for (size_t c : counts) {
      displ.push_back(fit(at));
      n.push_back(fit(c));
      at += c;
    }
    return add(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n.data(), displ.data(), type(t), comm_,
                               &request_),
               "MPI_Iallgatherv");
  }
  bool done(uint64_t ticket) override {
    const auto it = open_.find(ticket);
    if (it == open_.end()) return true;
    int flag = 0;
    check_mpi(MPI_Test(&it->second, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (!flag) return false;
    open_.erase(it);
    arrays_.erase(ticket);
    return true;
  }

 private:
  static int fit(size_t count) {
    LT_CHECK(count <= size_t(INT_MAX), "a nonblocking collective of ", count, " elements (MPI counts are int)");
    return int(count);
  }
  uint64_t add(int rc, const char* call) {
    check_mpi(rc, call);
    open_.emplace(next_, request_);
    return next_++;
  }
  MPI_Datatype type(DType t) const { return t == DType::kBF16 ? bf16_ : mpi_type(t); }
  MPI_Op sum(DType t) const { return t == DType::kBF16 ? bf16_sum_ : MPI_SUM; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype bf16_;
  MPI_Op bf16_sum_;
  int rank_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
  uint64_t next_ = 1;
  std::map<uint64_t, MPI_Request> open_;
  std::map<uint64_t, std::pair<std::vector<int>, std::vector<int>>> arrays_;  // allgather_v's counts
};

class MpiComm final : public Comm {
 public:
  MpiComm() {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &bf16_), "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&bf16_), "MPI_Type_commit");
    check_mpi(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_), "MPI_Op_create");
  }
  ~MpiComm() override {
    // Freed only while MPI is still up; after MPI_Finalize the handles are gone anyway.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Op_free(&bf16_sum_op_);
    MPI_Type_free(&bf16_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void allreduce_sum(void* buf, size_t count, DType t) override {
    auto* p = static_cast<char*>(buf);
    for (size_t done = 0; done < count; done += kMaxCount) {
      const size_t n = std::min(kMaxCount, count - done);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + done * dtype_size(t), int(n), type(t), sum(t), comm_), "MPI_Allreduce");
    }
  }

  void reduce_scatter_sum(void* buf, size_t shard_count, DType t) override {
    auto* p = static_cast<char*>(buf);
    const size_t shard_bytes = shard_count * dtype_size(t);
    if (shard_count <= kMaxCount) {
      // In place, MPI leaves this rank's reduced block at the start of the buffer; move it to
      // its own slot (the NCCL convention).
      check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, p, int(shard_count), type(t), sum(t), comm_),
            "MPI_Reduce_scatter_block");
      if (rank_ != 0) std::memmove(p + size_t(rank_) * shard_bytes, p, shard_bytes);
      return;
    }
    // Shards over 2^30 elements: one chunked reduce per owner.
    for (int r = 0; r < size_; ++r) reduce_sum(p + size_t(r) * shard_bytes, shard_count, t, r);
  }

  void reduce_sum(void* buf, size_t count, DType t, int root) override {
    auto* p = static_cast<char*>(buf);
    for (size_t done = 0; done < count; done += kMaxCount) {
      const size_t n = std::min(kMaxCount, count - done);
      char* chunk = p + done * dtype_size(t);
      if (rank_ == root)
        check_mpi(MPI_Reduce(MPI_IN_PLACE, chunk, int(n), type(t), sum(t), root, comm_), "MPI_Reduce");
      else
        check_mpi(MPI_Reduce(chunk, nullptr, int(n), type(t), sum(t), root, comm_), "MPI_Reduce");
    }
  }

  void allgather(void* buf, size_t shard_count, DType t) override {
    auto* p = static_cast<char*>(buf);
    if (shard_count <= kMaxCount) {
      check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, int(shard_count), type(t), comm_),
            "MPI_Allgather");
      return;
    }
    const size_t shard_bytes = shard_count * dtype_size(t);
    for (int r = 0; r < size_; ++r)
      for (size_t done = 0; done < shard_bytes; done += kMaxCount)
        check_mpi(MPI_Bcast(p + size_t(r) * shard_bytes + done, int(std::min(kMaxCount, shard_bytes - done)), MPI_BYTE,
                        r, comm_),
              "MPI_Bcast");
  }

  void reduce_scatter_v_sum(void* buf, const std::vector<size_t>& counts, DType t) override {
    std::vector<int> n, displ;
    if (!int_counts(counts, &n, &displ)) return Comm::reduce_scatter_v_sum(buf, counts, t);
    // In place, MPI leaves this rank's reduced piece at the start of the buffer (as the block
    // version): move it to its own slot.
    auto* p = static_cast<char*>(buf);
    check_mpi(MPI_Reduce_scatter(MPI_IN_PLACE, p, n.data(), type(t), sum(t), comm_), "MPI_Reduce_scatter");
    const size_t bytes = counts[size_t(rank_)] * dtype_size(t);
    if (displ[size_t(rank_)] != 0 && bytes > 0) std::memmove(p + size_t(displ[size_t(rank_)]) * dtype_size(t), p, bytes);
  }

  void allgather_v(void* buf, const std::vector<size_t>& counts, DType t) override {
    std::vector<int> n, displ;
    if (!int_counts(counts, &n, &displ)) return Comm::allgather_v(buf, counts, t);
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n.data(), displ.data(), type(t), comm_),
          "MPI_Allgatherv");
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    auto* p = static_cast<char*>(buf);
    for (size_t done = 0; done < bytes; done += kMaxCount)
      check_mpi(MPI_Bcast(p + done, int(std::min(kMaxCount, bytes - done)), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }
  std::unique_ptr<NonblockingCollectives> make_nonblocking() override {
    return std::make_unique<MpiNonblocking>(comm_, bf16_, bf16_sum_op_);
  }

 private:
  // MPI's int counts and displacements of the pieces; false when they do not fit an int.
  bool int_counts(const std::vector<size_t>& counts, std::vector<int>* n, std::vector<int>* displ) const {
    LT_CHECK(counts.size() == size_t(size_), "collective with ", counts.size(), " counts for ", size_, " ranks");
    size_t at = 0;
    for (size_t c : counts) {
      if (c > kMaxCount || at > kMaxCount) return false;
      n->push_back(int(c));
      displ->push_back(int(at));
      at += c;
    }
    return true;
  }

  MPI_Datatype type(DType t) const { return t == DType::kBF16 ? bf16_ : mpi_type(t); }
  MPI_Op sum(DType t) const { return t == DType::kBF16 ? bf16_sum_op_ : MPI_SUM; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype bf16_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_world_comm() { return std::make_unique<MpiComm>(); }

}  // namespace lt
