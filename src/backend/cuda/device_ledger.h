// The bookkeeping behind device_memory_stats() (device.h), shared by both builds of the device
// runtime (device_gpu.cu, device_sim.cpp): device_free is given only a pointer, so the size of
// every live allocation is kept here until it is freed.
#pragma once
#include <algorithm>
#include <cstddef>
#include <mutex>
#include <cstdint>
#include <map>

#include "backend/cuda/device.h"

LT_CUDA_NAMESPACE_BEGIN

class DeviceLedger {
 public:
  void on_alloc(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[reinterpret_cast<uintptr_t>(p)] = bytes;
    allocated_ += bytes;
    peak_ = std::max(peak_, allocated_);
  }
  void on_free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = sizes_.find(reinterpret_cast<uintptr_t>(p));
    if (it == sizes_.end()) return;
    allocated_ -= it->second;
    sizes_.erase(it);
  }
  // True when [p, p + bytes) lies inside one live allocation: what a device pointer handed to a
  // library must satisfy (the simulator's cuBLASLt checks its operands' extents with it).
  bool holds(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = sizes_.upper_bound(a);
    if (it == sizes_.begin()) return false;
    --it;
    return a - it->first + bytes <= it->second;
  }
  void on_driver_used(size_t used) {
    std::lock_guard<std::mutex> lock(mu_);
    driver_used_peak_ = std::max(driver_used_peak_, used);
  }
  DeviceMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceMemoryStats s;
    s.allocated_bytes = allocated_;
    s.peak_bytes = peak_;
    s.driver_used_peak = driver_used_peak_;
    return s;
  }

 private:
  std::mutex mu_;
  std::map<uintptr_t, size_t> sizes_;  // start -> bytes
  size_t allocated_ = 0, peak_ = 0, driver_used_peak_ = 0;
};

// One per process (one device per process) and per build. Never destroyed: a static DeviceBuffer
// may be freed after every function-local static is gone.
inline DeviceLedger& device_ledger() {
  static DeviceLedger* ledger = new DeviceLedger;
  return *ledger;
}

LT_CUDA_NAMESPACE_END
