// Page-locked host staging for uploads (device.h's copy_to_device_async): the host writes a slot,
// queues copies from it, and goes on. A ring of slots, so the host fills the next one while the
// copies of the last are still queued; a slot is rewritten only after the copies that read it have
// run (an event recorded after them; with two slots that is the upload of two batches back, long
// done on a GPU). Slots grow only, so a steady-state step allocates nothing here.
// Header-only, compiled in both builds (see device.h).
#pragma once
#include <cstddef>
#include <vector>

#include "backend/cuda/device.h"

LT_CUDA_NAMESPACE_BEGIN

class UploadStaging {
 public:
  explicit UploadStaging(size_t slots = 2) : slots_(slots) {}
  ~UploadStaging() {
    for (Slot& s : slots_) {
      wait_quietly(s);  // a copy still queued reads the slot
      event_destroy(s.copied);
      host_free_pinned(s.host);
    }
  }
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  // The next slot, at least `bytes` long, once the copies queued from it last time have run.
  void* next(size_t bytes) {
    current_ = next_;
    next_ = (next_ + 1) % slots_.size();
    Slot& s = slots_[current_];
    if (s.recorded) event_synchronize(s.copied);
    if (bytes > s.bytes) {
      host_free_pinned(s.host);
      s.host = nullptr;
      s.bytes = 0;
      s.host = host_alloc_pinned(bytes);
      s.bytes = bytes;
    }
    return s.host;
  }
  // After the copies from the slot next() returned were queued on stream.
  void copies_queued(cudaStream_t stream) {
    Slot& s = slots_[current_];
    if (!s.copied) s.copied = event_create();
    event_record(s.copied, stream);
    s.recorded = true;
  }

 private:
  struct Slot {
    void* host = nullptr;
    size_t bytes = 0;
    DeviceEvent copied = nullptr;
    bool recorded = false;
  };
  static void wait_quietly(Slot& s) noexcept {
    if (!s.recorded) return;
    try {
      event_synchronize(s.copied);
    } catch (...) {  // an earlier asynchronous error, reported where it was found
    }
  }
  std::vector<Slot> slots_;
  size_t next_ = 0, current_ = 0;
};

LT_CUDA_NAMESPACE_END
