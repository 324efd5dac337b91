// Fault injection in the device communicator of --device cuda-sim (device_comm_sim.cpp), to test
// that a lost or failing collective ends the job instead of hanging it (docs/devices.md, "When a
// collective fails"). Set for a run through the environment:
//   LT_SIM_COMM_FAULT=KIND:OP:N[@RANK]
//     KIND  hang   the collective is never reported complete (nor is any later one on the
//                  communicator): the host's next wait for it, synchronize(), reaches --comm-timeout;
//           error  the collective reports an asynchronous error, as ncclCommGetAsyncError would,
//                  at the host's next wait for it;
//     OP    allreduce, reduce, allgather, or any;
//     N     the N-th such collective (1-based) of the run's device communicator;
//     RANK  the rank it happens on (every rank when left out).
// e.g. LT_SIM_COMM_FAULT=hang:allreduce:1@1: the first gradient bucket of the first step on rank 1.
// The rank finds its fault where a GPU rank would, when it next waits; MPI's collectives still run
// (device_comm_sim.cpp says why), and the peers wait in what comes next until this rank ends the job.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cuda/device_comm.h"

LT_CUDA_NAMESPACE_BEGIN

struct SimCommFault {
  enum class Kind { kNone, kHang, kError };
  Kind kind = Kind::kNone;
  std::string op;  // "allreduce", "reduce", "allgather" or "any"
  int64_t n = 0;   // 1-based
  int rank = -1;   // -1: every rank
  std::string spec;  // as given, for messages
};

// The fault LT_SIM_COMM_FAULT's value `spec` describes (kNone for ""). Throws lt::Error naming
// the variable and the expected form for anything else.
SimCommFault parse_sim_comm_fault(const std::string& spec);

// The simulator's device communicator with `fault` injected (make_device_comm reads it from
// LT_SIM_COMM_FAULT).
std::unique_ptr<DeviceComm> make_sim_device_comm(Comm& host, cudaStream_t stream, double timeout_s,
                                                 const SimCommFault& fault);

LT_CUDA_NAMESPACE_END
