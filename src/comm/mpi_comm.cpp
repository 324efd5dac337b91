// The MPI implementation of Comm, over a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstring>

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

// MPI has no bf16: a 2-byte type with a user sum that accumulates in fp32 per pair.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check(MPI_Type_contiguous(2, MPI_BYTE, &bf16_), "MPI_Type_contiguous");
    check(MPI_Type_commit(&bf16_), "MPI_Type_commit");
    check(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_), "MPI_Op_create");
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
      check(MPI_Allreduce(MPI_IN_PLACE, p + done * dtype_size(t), int(n), type(t), sum(t), comm_), "MPI_Allreduce");
    }
  }

  void reduce_scatter_sum(void* buf, size_t shard_count, DType t) override {
    auto* p = static_cast<char*>(buf);
    const size_t shard_bytes = shard_count * dtype_size(t);
    if (shard_count <= kMaxCount) {
      // In place, MPI leaves this rank's reduced block at the start of the buffer; move it to
      // its own slot (the NCCL convention).
      check(MPI_Reduce_scatter_block(MPI_IN_PLACE, p, int(shard_count), type(t), sum(t), comm_),
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
        check(MPI_Reduce(MPI_IN_PLACE, chunk, int(n), type(t), sum(t), root, comm_), "MPI_Reduce");
      else
        check(MPI_Reduce(chunk, nullptr, int(n), type(t), sum(t), root, comm_), "MPI_Reduce");
    }
  }

  void allgather(void* buf, size_t shard_count, DType t) override {
    auto* p = static_cast<char*>(buf);
    if (shard_count <= kMaxCount) {
      check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, int(shard_count), type(t), comm_),
            "MPI_Allgather");
      return;
    }
    const size_t shard_bytes = shard_count * dtype_size(t);
    for (int r = 0; r < size_; ++r)
      for (size_t done = 0; done < shard_bytes; done += kMaxCount)
        check(MPI_Bcast(p + size_t(r) * shard_bytes + done, int(std::min(kMaxCount, shard_bytes - done)), MPI_BYTE,
                        r, comm_),
              "MPI_Bcast");
  }

  void reduce_scatter_v_sum(void* buf, const std::vector<size_t>& counts, DType t) override {
    std::vector<int> n, displ;
    if (!int_counts(counts, &n, &displ)) return Comm::reduce_scatter_v_sum(buf, counts, t);
    // In place, MPI leaves this rank's reduced piece at the start of the buffer (as the block
    // version): move it to its own slot.
    auto* p = static_cast<char*>(buf);
    check(MPI_Reduce_scatter(MPI_IN_PLACE, p, n.data(), type(t), sum(t), comm_), "MPI_Reduce_scatter");
    const size_t bytes = counts[size_t(rank_)] * dtype_size(t);
    if (displ[size_t(rank_)] != 0 && bytes > 0) std::memmove(p + size_t(displ[size_t(rank_)]) * dtype_size(t), p, bytes);
  }

  void allgather_v(void* buf, const std::vector<size_t>& counts, DType t) override {
    std::vector<int> n, displ;
    if (!int_counts(counts, &n, &displ)) return Comm::allgather_v(buf, counts, t);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n.data(), displ.data(), type(t), comm_),
          "MPI_Allgatherv");
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    auto* p = static_cast<char*>(buf);
    for (size_t done = 0; done < bytes; done += kMaxCount)
      check(MPI_Bcast(p + done, int(std::min(kMaxCount, bytes - done)), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

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

  MPI_Datatype type(DType t) const {
    switch (t) {
      case DType::kF32: return MPI_FLOAT;
      case DType::kBF16: return bf16_;
      case DType::kF64: return MPI_DOUBLE;
      case DType::kI64: return MPI_INT64_T;
    }
    return MPI_DATATYPE_NULL;
  }
  MPI_Op sum(DType t) const { return t == DType::kBF16 ? bf16_sum_op_ : MPI_SUM; }

  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    const World& w = world();
    fail(strcat(call, " failed on rank ", w.rank, "/", w.size, " (", w.host, "): ", std::string(msg, size_t(len))));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype bf16_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_world_comm() { return std::make_unique<MpiComm>(); }

}  // namespace lt
