// A std::allocator that aligns every block to a cache line (64 bytes). malloc aligns large blocks
// to only 16 bytes (its header before an mmap'ed region), so a row of a (rows, cols) float matrix
// can straddle cache lines; oneDNN's AMX kernels then split every 64-byte tile-row store in two
// (measured here: the 2048 x 32000 logits product 2.5x slower into a std::vector than into
// 64-byte aligned storage). The CPU backend's activation buffers and the bf16 copies use it.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace lt::cpu {

template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAlignedAllocator() = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CacheAlignedAllocator<U>&) const noexcept { return false; }
};

template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

}  // namespace lt::cpu
