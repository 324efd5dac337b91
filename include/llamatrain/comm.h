// The comm layer: the collectives data-parallel training needs, over host buffers (MPI) and,
// later, device buffers (NCCL) behind the same interface.
//
// Conventions (those of NCCL, so both implementations agree):
//  * every call is collective: all ranks call it in the same order with the same counts;
//  * buffers are in place; a sharded buffer holds size() shards of `shard_count` elements, shard r
//    at buf + r * shard_count (the caller pads the flat vector to a multiple of the world size);
//  * reductions are sums.
// Failures throw lt::Error naming the call, the rank and the MPI error string (communicators use
// MPI_ERRORS_RETURN so that every call can be checked).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llamatrain/error.h"

namespace lt {

enum class DType { kF32, kBF16, kF64, kI64 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// Collectives that complete later (MPI's nonblocking ones), for a device communicator whose
// memory is the host's: cuda-sim's (src/backend/cuda/device_comm_sim.cpp), whose collectives, like
// NCCL's, complete while the host goes on. start_* begins one, in place, with Comm's conventions
// below, and returns its ticket; the buffer is the collective's until done(ticket). Every rank
// starts the same ones in the same order. They run on a communicator of their own, so they never
// pair with a blocking call of the Comm that made them, in whatever order a rank mixes the two.
class NonblockingCollectives {
 public:
  virtual ~NonblockingCollectives() = default;
  virtual uint64_t start_allreduce_sum(void* buf, size_t count, DType t) = 0;
  virtual uint64_t start_reduce_sum(void* buf, size_t count, DType t, int root) = 0;
  virtual uint64_t start_allgather(void* buf, size_t shard_count, DType t) = 0;
  virtual uint64_t start_allgather_v(void* buf, const std::vector<size_t>& counts, DType t) = 0;
  // Whether the collective has completed; each call also lets the library make progress.
  virtual bool done(uint64_t ticket) = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi" or "self"

  // buf[0, count) = sum over ranks of buf[0, count).
  virtual void allreduce_sum(void* buf, size_t count, DType t) = 0;
  // buf holds size() * shard_count elements; afterwards shard rank() of buf holds the sum over
  // ranks of that shard (the other shards are left unspecified).
  virtual void reduce_scatter_sum(void* buf, size_t shard_count, DType t) = 0;
  // buf[0, count) of `root` = sum over ranks of buf[0, count) (in place; the other ranks' buf is
  // left unchanged). Reduce-scatter with uneven pieces is one of these per owner.
  virtual void reduce_sum(void* buf, size_t count, DType t, int root) = 0;
  // buf holds size() * shard_count elements of which shard rank() is this rank's; afterwards every
  // shard holds its owner's values.
  virtual void allgather(void* buf, size_t shard_count, DType t) = 0;
  // buf[0, bytes) of `root` is copied to every rank.
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // Uneven pieces: buf holds every rank's piece back to back, piece r of counts[r] elements
  // (counts alike on every rank, zeros allowed). reduce_scatter_v_sum: afterwards piece rank()
  // holds the sum over ranks of that piece (the others are left unspecified). allgather_v: piece
  // rank() is this rank's; afterwards every piece holds its owner's values. The defaults are one
  // reduce_sum / broadcast per owner.
  virtual void reduce_scatter_v_sum(void* buf, const std::vector<size_t>& counts, DType t);
  virtual void allgather_v(void* buf, const std::vector<size_t>& counts, DType t);
  virtual void barrier() = 0;
  // The nonblocking collectives of this communicator's ranks (a collective call). MPI's are MPI's;
  // the default runs this Comm's blocking call at start, complete at once (one rank, test views).
  virtual std::unique_ptr<NonblockingCollectives> make_nonblocking();

  // Typed conveniences.
  void allreduce_sum(float* buf, size_t n) { allreduce_sum(buf, n, DType::kF32); }
  void allreduce_sum(double* buf, size_t n) { allreduce_sum(buf, n, DType::kF64); }
  void allreduce_sum(int64_t* buf, size_t n) { allreduce_sum(buf, n, DType::kI64); }
  double allreduce_sum(double x) {
    allreduce_sum(&x, 1);
    return x;
  }
  // Every rank's `values` (the same count on every rank), rank-major: out[r * n + i].
  std::vector<double> allgather_values(const std::vector<double>& values);
  // Every rank's string, cut to kMaxGatheredString bytes (host and device names).
  std::vector<std::string> allgather_strings(const std::string& s);
  static constexpr size_t kMaxGatheredString = 248;
};

// The world communicator: MPI when this process was launched by an MPI launcher, else a one-rank
// communicator that needs no MPI. Created once; valid until MPI is finalized.
Comm& world_comm();
// A one-rank communicator (copies nothing, reduces nothing).
std::unique_ptr<Comm> make_self_comm();

// Runs f on every rank and agrees on the outcome: when f throws lt::Error on any rank, every rank
// throws CollectiveError with the message of the lowest failing rank (prefixed with "[rank r] "
// when not every rank failed), so errors all ranks detect alike are reported once by rank 0 and
// no rank is left waiting in a collective.
void agree_on_error(Comm& comm, const std::string* local_error);  // throws CollectiveError

template <class F>
void agree(Comm& comm, F&& f) {
  std::string what;
  bool failed = false;
  try {
    f();
  } catch (const Error& e) {
    what = e.what();
    failed = true;
  }
  agree_on_error(comm, failed ? &what : nullptr);
}

}  // namespace lt
