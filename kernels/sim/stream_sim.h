// Streams and events of the CUDA execution simulator (part of its runtime, llamatrain_cuda_sim).
// DESIGN.md, "Testing without a GPU", item 2: streams and events executed in any order a GPU could
// produce.
//
// Two modes:
// * immediate (the default): every operation runs when it is issued, whatever its stream. The
//   kernel tests, which launch on plain host memory and read their results straight from it,
//   run this way.
// * queued (set_queued_streams(true); the cuda-sim device runtime, src/backend/cuda/device_sim.cpp,
//   turns it on at its first allocation): kernel launches, async copies and memsets, cuBLASLt
//   products and event records/waits are queued on their stream and run only at synchronisation
//   points (stream/event/device synchronisation, the host copies, device_free), in an order a GPU
//   could produce: each stream in issue order (a collective, start_in_order, holds its stream from
//   its start until it lands); across streams, any interleaving that honours the event waits,
//   chosen by the stream order (set_stream_order, else LT_SIM_STREAM_ORDER, same syntax as
//   LT_SIM_SCHEDULE):
//     forward      the earliest-issued ready operation first: program order, the old behaviour;
//     reverse      the latest-issued ready operation first: a stream that should have waited for
//                  an earlier one runs ahead of it;
//     random:SEED  a seeded choice among the streams with a ready operation, at every step.
//   A work-stealing GPU may also overlap operations; running them one at a time in any of these
//   orders covers the outcomes of a program whose cross-stream accesses are ordered by events, and
//   changes the result of (or reports) one that relies on timing.
//
// Streams are non-blocking (cudaStreamNonBlocking, what device.h's stream_create makes): the
// default stream (nullptr, stream 0) does not synchronise with them implicitly. The host copies
// have cudaMemcpy's semantics on the legacy default stream: they wait for the default stream, not
// for other streams. What they would then touch while work queued on another stream still writes
// it (or, for a host write, reads it) is a race, reported and stopped: host_read/host_write below.
// Kernels do not say what they read and write, so a kernel still queued on another stream counts as
// touching all device memory; copies, memsets, products and collectives name their ranges.
//
// One host thread drives the simulated device (one process per device, as in llamatrain).
#pragma once
#include <cuda_bf16.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/cuda_sim.h"

namespace lt::sim {

void set_queued_streams(bool on);
bool queued_streams();

// The order across streams (see above); parse_schedule's syntax. LT_SIM_STREAM_ORDER when not set.
void set_stream_order(Schedule s);
Schedule current_stream_order();

// Streams: the handle is the simulator's own object (nullptr is the default stream).
cudaStream_t stream_create();
void stream_destroy(cudaStream_t s);  // runs what is still queued on s first

// Events (cudaEvent_t is the driver's type; the simulator has its own handle).
struct Event;
Event* event_create();
void event_destroy(Event* e);  // a wait already queued on e keeps what it needs
// Queues on s: e completes when everything queued on s before it has run.
void event_record(Event* e, cudaStream_t s);
// Queues on s: what is queued on s later runs after e's latest record (issued before this call).
void stream_wait_event(cudaStream_t s, Event* e);

// Synchronisation points: run queued work until the condition holds.
void event_synchronize(Event* e);
void stream_synchronize(cudaStream_t s);
void device_synchronize();

// The device memory an operation reads and writes. `everything`: unknown (a kernel), counts as
// reading and writing all of it.
struct Range {
  const void* p = nullptr;
  size_t bytes = 0;
};
struct Access {
  std::vector<Range> reads, writes;
  bool everything = false;
};
// Queues `run` on s (immediate mode: runs it now). `what` names it in reports.
void enqueue(cudaStream_t s, std::string what, Access access, std::function<void()> run);
// An operation that starts at its point of issue and completes later, such as a collective over
// the host's MPI communicator (nonblocking, so a GPU's NCCL collective: its peers must start it in
// the same program order, and it completes while the host goes on): queued on s, then s is run up
// to it (with whatever s waits for) and `start` is called before this returns. It stays at the
// head of s until done() returns true: what is queued on s after it, and a synchronisation that
// needs it, wait (polling done()) until then.
void start_in_order(cudaStream_t s, std::string what, Access access, std::function<void()> start,
                    std::function<bool()> done);

// cudaMemcpyAsync / cudaMemsetAsync on s.
void memcpy_async(void* dst, const void* src, size_t bytes, cudaStream_t s);
void memset_async(void* p, int value, size_t bytes, cudaStream_t s);

// The host is about to read (write) [p, p + bytes) of device memory, as cudaMemcpy does: the
// default stream runs to completion first; then work still queued on another stream that writes
// (reads or writes) the range is reported as a race and stops the program.
void host_read(const void* p, size_t bytes, const char* what);
void host_write(const void* p, size_t bytes, const char* what);

// Fault injection for the tests that prove the detection: every stream_wait_event does nothing.
void skip_stream_waits(bool on);

}  // namespace lt::sim
