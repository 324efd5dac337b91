// The counts behind device_counters() (device.h), shared by both builds of the device runtime
// (device_gpu.cu, device_sim.cpp), which add to them at the same calls, so a cuda-sim test of the
// counts holds for a GPU too.
#pragma once
#include <atomic>
#include <cstdint>

#include "backend/cuda/device.h"

LT_CUDA_NAMESPACE_BEGIN

struct DeviceCountersAtomic {
  std::atomic<uint64_t> allocs{0}, frees{0}, device_syncs{0}, stream_syncs{0}, h2d_copies{0}, d2h_copies{0},
      blocking_copies{0}, plans_built{0};
  DeviceCounters read() const {
    DeviceCounters c;
    c.allocs = allocs.load();
    c.frees = frees.load();
    c.device_syncs = device_syncs.load();
    c.stream_syncs = stream_syncs.load();
    c.h2d_copies = h2d_copies.load();
    c.d2h_copies = d2h_copies.load();
    c.blocking_copies = blocking_copies.load();
    c.plans_built = plans_built.load();
    return c;
  }
};

// One per process and build; never destroyed (a static DeviceBuffer may be freed late).
inline DeviceCountersAtomic& device_counts() {
  static DeviceCountersAtomic* c = new DeviceCountersAtomic;
  return *c;
}

LT_CUDA_NAMESPACE_END
