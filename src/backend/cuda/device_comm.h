// Collectives on device buffers, for the ZeRO optimizer on the device (device_zero.h; DESIGN.md
// "Comm": NCCL for device buffers, bootstrapped with MPI). One implementation per build:
//   device_comm_gpu.cu  NCCL (opened with dlopen on first use, like cuBLASLt), the communicator
//                       made from a unique id that rank 0 broadcasts over the host communicator;
//   device_comm_sim.cpp the host communicator itself (MPI), since the simulator's device memory
//                       is host memory: --device cuda-sim runs the same calls with MPI in place
//                       of NCCL.
// Conventions of lt::Comm (comm.h): every call is collective, in the same order with the same
// counts on every rank; buffers are in place; sums. Calls are queued on the stream given at
// creation (the GPU build returns before the transfer is done): synchronize() waits for them, by
// polling up to the timeout given at creation (llamatrain/comm_wait.h), never by blocking in a
// stream synchronisation that a lost peer would make endless. A collective that fails, or does not
// complete in time, aborts the communicator and throws lt::CommFault naming the rank's collective.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cuda_compat.cuh"
#include "llamatrain/comm.h"

LT_CUDA_NAMESPACE_BEGIN

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "nccl" or "mpi"
  // buf[0, count) = sum over ranks of buf[0, count).
  virtual void allreduce_sum(float* buf, size_t count) = 0;
  // buf[0, count) of `root` = sum over ranks of buf[0, count); the other ranks' buf is unchanged.
  virtual void reduce_sum(float* buf, size_t count, int root) = 0;
  // The same in bf16 (--grad-reduce-dtype bf16: half the bytes on the wire). NCCL adds in fp32 and
  // rounds to bf16 at each hop; the simulator's MPI sum does the same per pair of ranks.
  virtual void allreduce_sum(__nv_bfloat16* buf, size_t count) = 0;
  virtual void reduce_sum(__nv_bfloat16* buf, size_t count, int root) = 0;
  // buf holds size() shards of shard_count elements, shard r at buf + r * shard_count; this
  // rank's shard is its own. Afterwards every shard holds its owner's values.
  virtual void allgather(__nv_bfloat16* buf, size_t shard_count) = 0;
  // Uneven pieces (lt::Comm::allgather_v): buf holds every rank's piece back to back, piece r of
  // counts[r] elements; piece rank() is this rank's; afterwards every piece holds its owner's
  // values. Named "allgather" in fault reports.
  virtual void allgather_v(__nv_bfloat16* buf, const std::vector<size_t>& counts) = 0;
  // Calls between group_begin() and group_end() are issued together (NCCL groups: several
  // reduces to different roots then progress at once instead of one after another).
  virtual void group_begin() = 0;
  virtual void group_end() = 0;
  // What the collectives issued from now on are for, named in fault reports: "gradients of
  // layer 3, step 12".
  virtual void set_context(std::string /*context*/) {}
  // Waits for every collective issued so far (see above).
  virtual void synchronize() = 0;
};

// The device communicator of the ranks of `host` (a collective call: every rank of host makes it).
// timeout_s: how long synchronize() waits for a collective (train --comm-timeout).
std::unique_ptr<DeviceComm> make_device_comm(Comm& host, cudaStream_t stream, double timeout_s);

LT_CUDA_NAMESPACE_END
