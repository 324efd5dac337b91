// The simulator's race detector: per 2-byte granule, the last write and the last read(s) of
// simulated threads, checked at every access of the instrumented kernels (see race_sim.h for the
// model, kernels/README.md for how it is built and tested).
#include "race_sim.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>

#include "cuda_sim.h"

namespace lt::sim {

thread_local RunningThread t_running;

namespace {

std::atomic<bool> g_instrumented{false};  // some checked code called __tsan_init
std::atomic<int> g_on{-1};                // -1: not decided yet (LT_SIM_RACES), 0 off, 1 on

bool checking() {
  int on = g_on.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* env = std::getenv("LT_SIM_RACES");
    on = (env != nullptr && std::strcmp(env, "0") == 0) ? 0 : 1;
    g_on.store(on, std::memory_order_relaxed);
  }
  return on == 1 && g_instrumented.load(std::memory_order_relaxed);
}

// ---- what an address is ---------------------------------------------------------------------------
enum class Space { kGlobal, kStaticShared, kDynamicShared };

// Static __shared__ arrays are function-static thread_locals (cuda_sim.h), so they live in the
// executable's static TLS block: on x86-64 (TLS variant II) the block ends at the thread pointer and
// is p_memsz bytes long, rounded up to its alignment. The simulator's own thread_locals that kernel
// code reads (threadIdx, blockIdx, blockDim, gridDim) are in that block too and are excluded.
struct TlsRange {
  uintptr_t lo = 0, hi = 0;
};

int find_executable_tls(dl_phdr_info* info, size_t, void* out) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS) continue;
    auto* r = static_cast<TlsRange*>(out);
    const uintptr_t align = ph.p_align > 0 ? ph.p_align : 1;
    r->hi = (ph.p_memsz + align - 1) / align * align;  // the size, turned into a range by the caller
    r->lo = align;
  }
  return 1;  // the first object is the executable itself
}

const TlsRange& static_tls() {
  thread_local TlsRange range;
  thread_local bool known = false;
  if (!known) {
    known = true;
#if defined(__x86_64__)
    TlsRange size;
    dl_iterate_phdr(find_executable_tls, &size);
    uintptr_t tp = 0;
    asm("movq %%fs:0, %0" : "=r"(tp));
    range.lo = tp - size.hi - size.lo;  // one alignment unit of slack below: the block's start padding
    range.hi = tp;
    const auto own = reinterpret_cast<uintptr_t>(&thread_idx);
    if (own < range.lo || own >= range.hi) range = TlsRange{};  // not where expected: classify nothing as static shared
#endif
  }
  return range;
}

bool is_builtin_variable(uintptr_t a) {
  auto inside = [a](const void* p, size_t n) {
    const auto b = reinterpret_cast<uintptr_t>(p);
    return a >= b && a < b + n;
  };
  return inside(&thread_idx, sizeof thread_idx) || inside(&block_idx, sizeof block_idx) ||
         inside(&block_dim, sizeof block_dim) || inside(&grid_dim, sizeof grid_dim) ||
         inside(&t_running, sizeof t_running);
}

// ---- shadow records -----------------------------------------------------------------------------
constexpr uint8_t kAtomic = 1;  // the access was an atomic operation
constexpr uint8_t kMany = 2;    // (reads) several threads read it in this interval

struct Access {
  uint32_t launch = 0;  // 0: no access recorded
  uint32_t block = 0;
  uint32_t interval = 0;
  uint32_t pc = 0;  // return address of the instrumentation call, as an offset in the executable
  uint16_t tid = 0;
  uint8_t fence = 0;
  uint8_t flags = 0;
};
struct Cell {
  Access write, read;
};

constexpr int kPageShift = 12;
constexpr size_t kGranule = 2;
constexpr size_t kCellsPerPage = (size_t(1) << kPageShift) / kGranule;
constexpr size_t kMaxPages = 8192;  // about 650 MiB of shadow before it is dropped at a launch

struct Page {
  Cell cells[kCellsPerPage];
};

struct Shadow {
  std::unordered_map<uintptr_t, std::unique_ptr<Page>> pages;
  uintptr_t last_key = ~uintptr_t(0);
  Page* last = nullptr;

  Cell& cell(uintptr_t a) {
    const uintptr_t key = a >> kPageShift;
    if (key != last_key) {
      auto& p = pages[key];
      if (!p) p = std::make_unique<Page>();
      last_key = key;
      last = p.get();
    }
    return last->cells[(a & ((uintptr_t(1) << kPageShift) - 1)) / kGranule];
  }
  void clear() {
    pages.clear();
    last_key = ~uintptr_t(0);
    last = nullptr;
  }
};
thread_local Shadow t_shadow;

uintptr_t executable_base() {
  static const uintptr_t base = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&executable_base), &info);
    return reinterpret_cast<uintptr_t>(info.dli_fbase);
  }();
  return base;
}

bool same_block(const Access& a, const Access& b) { return a.launch == b.launch && a.block == b.block; }

// Whether `prev` and `now` may happen in either order on the device.
bool concurrent(const Access& prev, const Access& now, Space space) {
  if (prev.launch != now.launch) return false;  // launches are ordered (prev.launch 0: nothing recorded)
  if (prev.block != now.block) return space == Space::kGlobal;  // shared memory is the block's own
  if (prev.tid == now.tid || prev.interval != now.interval) return false;
  const bool same_warp = prev.tid / kWarpSize == now.tid / kWarpSize;
  return !(same_warp && prev.fence != now.fence);
}

bool conflict(const Access& prev, const Access& now, Space space) {
  return concurrent(prev, now, space) && !((prev.flags & kAtomic) && (now.flags & kAtomic));
}

// ---- reports ----------------------------------------------------------------------------------------
std::string executable_path() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, size_t(n)) : std::string();
}

// "file:line (function)" of a code offset, from addr2line (binutils) on this executable.
std::string symbolize(uint32_t offset, bool function_only) {
  char cmd[4300];
  std::snprintf(cmd, sizeof cmd, "addr2line -C -f -e '%s' 0x%" PRIx32 " 2>/dev/null", executable_path().c_str(),
                offset);
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  const size_t nl = out.find('\n');
  if (nl == std::string::npos) return "offset 0x" + std::to_string(offset);
  std::string function = out.substr(0, nl);
  for (size_t at; (at = function.find("(anonymous namespace)::")) != std::string::npos;) function.erase(at, 23);
  function = function.substr(0, function.find('('));  // without the parameter list
  std::string where = out.substr(nl + 1, out.find('\n', nl + 1) - nl - 1);
  if (const size_t slash = where.rfind('/'); slash != std::string::npos) where = where.substr(slash + 1);
  where = where.substr(0, where.find(' '));  // without " (discriminator N)"
  return function_only ? function : where + " (" + function + ")";
}

std::string thread_name(uint32_t tid) {
  const uint32_t x = tid % block_dim.x, y = tid / block_dim.x % block_dim.y, z = tid / (block_dim.x * block_dim.y);
  return std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z);
}

std::string describe_space(uintptr_t a, Space space) {
  if (space == Space::kStaticShared) return "a static __shared__ array";
  if (space == Space::kDynamicShared)
    return "dynamic shared memory, byte " + std::to_string(a - reinterpret_cast<uintptr_t>(t_running.smem)) + " of " +
           std::to_string(t_running.smem_bytes);
  return "global memory";
}

[[noreturn]] void report(const char* what, uintptr_t a, size_t bytes, Space space, const char* now_kind,
                         const Access& now, const char* prev_kind, const Access& prev) {
  const std::string kernel = symbolize(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(t_running.kernel) -
                                                              executable_base()), true);
  char addr[64];
  std::snprintf(addr, sizeof addr, "0x%" PRIxPTR, a);
  std::string msg = std::string(what) + " in kernel " + kernel + ": " + now_kind + " of " + std::to_string(bytes) +
                    " bytes at " + addr + " (" + describe_space(a, space) + ") by thread " + thread_name(now.tid) +
                    " at " + symbolize(now.pc, false);
  if (prev.launch != 0) {
    msg += std::string("; earlier ") + prev_kind + " by thread " + thread_name(prev.tid);
    if (prev.block != now.block) msg += " of block " + std::to_string(prev.block) + " (linear index)";
    msg += " at " + symbolize(prev.pc, false);
    msg += prev.block != now.block ? ", in the same launch (blocks are not ordered)"
                                   : ", in the same barrier interval (no __syncthreads() or __syncwarp() between)";
  }
  fail_kernel(msg.c_str());
}

// ---- the check of one access ------------------------------------------------------------------------
// The first read of shared memory the block has not written, reported when its barrier interval ends
// unless a write by another thread in the same interval is reported first as the race it is (the
// usual cause: a missing __syncthreads() between the write and the read).
struct PoisonRead {
  bool seen = false;
  uintptr_t a = 0;
  size_t bytes = 0;
  Space space = Space::kGlobal;
  Access read;
};
thread_local PoisonRead t_poison;

void check_read(Cell& c, const Access& now, uintptr_t a, size_t bytes, Space space) {
  if (space != Space::kGlobal && !same_block(c.write, now) && !t_poison.seen) t_poison = {true, a, bytes, space, now};
  if (conflict(c.write, now, space)) report("data race", a, bytes, space, "read", now, "write", c.write);
  if (same_block(c.read, now) && c.read.interval == now.interval && c.read.tid != now.tid) {
    const uint8_t keep = c.read.flags & kAtomic & now.flags;  // atomic only if every reader was
    c.read = now;
    c.read.flags = static_cast<uint8_t>(keep | kMany);
  } else {
    c.read = now;
  }
}

void check_write(Cell& c, const Access& now, uintptr_t a, size_t bytes, Space space) {
  if (conflict(c.write, now, space)) report("data race", a, bytes, space, "write", now, "write", c.write);
  if (conflict(c.read, now, space)) report("data race", a, bytes, space, "write", now, "read", c.read);
  if ((c.read.flags & kMany) && same_block(c.read, now) && c.read.interval == now.interval &&
      !((c.read.flags & kAtomic) && (now.flags & kAtomic)))
    report("data race", a, bytes, space, "write", now, "read (by several threads, this one among them)", c.read);
  c.write = now;
  c.read = Access{};
}

Space classify(uintptr_t a, const RunningThread& r) {
  const auto smem = reinterpret_cast<uintptr_t>(r.smem);
  if (a >= smem && a < smem + r.smem_bytes) return Space::kDynamicShared;
  const TlsRange& tls = static_tls();
  if (a >= tls.lo && a < tls.hi) return Space::kStaticShared;
  return Space::kGlobal;
}

void access(const void* addr, size_t bytes, bool write, bool atomic, const void* pc) {
  const RunningThread& r = t_running;
  // Outside a simulated thread (warp_fence null: run_grid's and run_block's own bookkeeping, which
  // may call the instrumented copy of a std template the linker kept from the checked code).
  if (!r.in_kernel || r.warp_fence == nullptr || bytes == 0 || !checking()) return;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (a >= r.stack_lo && a < r.stack_hi) return;  // the thread's own stack
  if (is_builtin_variable(a)) return;
  const Space space = classify(a, r);
  // A function-static thread_local of a type that is not trivially constructible (__nv_bfloat16)
  // has a one-byte guard in the same TLS block, read at every access; no kernel keeps bytes in
  // static shared memory, so one-byte accesses there are taken for that guard.
  if (space == Space::kStaticShared && bytes == 1) return;
  Access now;
  now.launch = r.launch;
  now.block = r.block;
  now.interval = static_cast<uint32_t>(*r.interval);
  now.pc = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(pc) - 1 - executable_base());
  now.tid = static_cast<uint16_t>(r.tid);
  now.fence = static_cast<uint8_t>(*r.warp_fence);
  now.flags = atomic ? kAtomic : 0;
  for (uintptr_t g = a & ~uintptr_t(kGranule - 1); g < a + bytes; g += kGranule) {
    Cell& c = t_shadow.cell(g);
    if (write) {
      check_write(c, now, a, bytes, space);
    } else {
      check_read(c, now, a, bytes, space);
    }
  }
}

}  // namespace

bool race_detection_available() { return g_instrumented.load(); }

void set_race_detection(bool on) { g_on.store(on ? 1 : 0); }

namespace race {

void launch_started() {
  if (t_shadow.pages.size() > kMaxPages) t_shadow.clear();
  t_poison = PoisonRead{};
}

void interval_ended() {
  if (!t_poison.seen) return;
  const PoisonRead p = t_poison;
  t_poison = PoisonRead{};
  report("read of uninitialised shared memory", p.a, p.bytes, p.space, "read", p.read, "", Access{});
}

void note_read(const void* addr, size_t bytes, const void* pc) { access(addr, bytes, false, false, pc); }
void note_write(const void* addr, size_t bytes, const void* pc) { access(addr, bytes, true, false, pc); }

}  // namespace race

}  // namespace lt::sim

// ---- the entry points of GCC's -fsanitize=thread instrumentation -----------------------------------
// Answered here instead of by ThreadSanitizer's runtime (never linked with the checked build). The
// atomics perform the operation (sequentially consistent) and are recorded as atomic accesses.
#define LT_RACE_NOINLINE extern "C" __attribute__((noinline, visibility("default")))
#define LT_RACE_PC __builtin_return_address(0)

LT_RACE_NOINLINE void __tsan_init() { lt::sim::g_instrumented.store(true); }
LT_RACE_NOINLINE void __tsan_func_entry(void*) {}
LT_RACE_NOINLINE void __tsan_func_exit() {}
LT_RACE_NOINLINE void __tsan_vptr_update(void**, void*) {}
LT_RACE_NOINLINE void __tsan_vptr_read(void**) {}
LT_RACE_NOINLINE void __tsan_read_range(void* a, unsigned long n) { lt::sim::access(a, n, false, false, LT_RACE_PC); }
LT_RACE_NOINLINE void __tsan_write_range(void* a, unsigned long n) { lt::sim::access(a, n, true, false, LT_RACE_PC); }

#define LT_RACE_PLAIN(N)                                                                                          \
  LT_RACE_NOINLINE void __tsan_read##N(void* a) { lt::sim::access(a, N, false, false, LT_RACE_PC); }              \
  LT_RACE_NOINLINE void __tsan_write##N(void* a) { lt::sim::access(a, N, true, false, LT_RACE_PC); }              \
  LT_RACE_NOINLINE void __tsan_unaligned_read##N(void* a) { lt::sim::access(a, N, false, false, LT_RACE_PC); }    \
  LT_RACE_NOINLINE void __tsan_unaligned_write##N(void* a) { lt::sim::access(a, N, true, false, LT_RACE_PC); }    \
  LT_RACE_NOINLINE void __tsan_volatile_read##N(void* a) { lt::sim::access(a, N, false, false, LT_RACE_PC); }     \
  LT_RACE_NOINLINE void __tsan_volatile_write##N(void* a) { lt::sim::access(a, N, true, false, LT_RACE_PC); }
LT_RACE_PLAIN(1)
LT_RACE_PLAIN(2)
LT_RACE_PLAIN(4)
LT_RACE_PLAIN(8)
LT_RACE_PLAIN(16)

#define LT_RACE_RMW(N, T, NAME, BUILTIN)                                                                         \
  LT_RACE_NOINLINE T __tsan_atomic##N##_##NAME(volatile T* a, T v, int) {                                        \
    lt::sim::access(const_cast<T*>(a), sizeof(T), true, true, LT_RACE_PC);                                      \
    return BUILTIN(a, v, __ATOMIC_SEQ_CST);                                                                       \
  }
#define LT_RACE_ATOMICS(N, T)                                                                                     \
  LT_RACE_NOINLINE T __tsan_atomic##N##_load(const volatile T* a, int) {                                        \
    lt::sim::access(const_cast<T*>(a), sizeof(T), false, true, LT_RACE_PC);                                     \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                                  \
  }                                                                                                               \
  LT_RACE_NOINLINE void __tsan_atomic##N##_store(volatile T* a, T v, int) {                                     \
    lt::sim::access(const_cast<T*>(a), sizeof(T), true, true, LT_RACE_PC);                                      \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                                     \
  }                                                                                                               \
  LT_RACE_RMW(N, T, exchange, __atomic_exchange_n)                                                                \
  LT_RACE_RMW(N, T, fetch_add, __atomic_fetch_add)                                                                \
  LT_RACE_RMW(N, T, fetch_sub, __atomic_fetch_sub)                                                                \
  LT_RACE_RMW(N, T, fetch_and, __atomic_fetch_and)                                                                \
  LT_RACE_RMW(N, T, fetch_or, __atomic_fetch_or)                                                                  \
  LT_RACE_RMW(N, T, fetch_xor, __atomic_fetch_xor)                                                                \
  LT_RACE_RMW(N, T, fetch_nand, __atomic_fetch_nand)                                                              \
  LT_RACE_NOINLINE int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {         \
    lt::sim::access(const_cast<T*>(a), sizeof(T), true, true, LT_RACE_PC);                                      \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                      \
  }                                                                                                               \
  LT_RACE_NOINLINE int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {           \
    lt::sim::access(const_cast<T*>(a), sizeof(T), true, true, LT_RACE_PC);                                      \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                      \
  }                                                                                                               \
  LT_RACE_NOINLINE T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {               \
    lt::sim::access(const_cast<T*>(a), sizeof(T), true, true, LT_RACE_PC);                                      \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                            \
    return c;                                                                                                     \
  }
LT_RACE_ATOMICS(8, unsigned char)
LT_RACE_ATOMICS(16, unsigned short)
LT_RACE_ATOMICS(32, unsigned int)
LT_RACE_ATOMICS(64, unsigned long long)

LT_RACE_NOINLINE void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
LT_RACE_NOINLINE void __tsan_atomic_signal_fence(int) {}
