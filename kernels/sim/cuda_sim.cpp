// The simulator's scheduler: blocks in order, the threads of a block as fibers that switch only
// at barriers. See cuda_sim.h for the model.
//
// Fibers switch with a few lines of x86-64 assembly (lt_sim_switch_stack below) rather than
// swapcontext: glibc's swapcontext saves and restores the signal mask with a system call on every
// switch, which made a whole-model run on the simulator spend nearly all its time in
// rt_sigprocmask (4.8 million calls for one small forward+backward). Other architectures use
// ucontext.
#include "cuda_sim.h"

#include "llamatrain/rng.h"
#include "race_sim.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define LT_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LT_SIM_ASAN 1
#endif
#endif
#if defined(LT_SIM_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__)
#define LT_SIM_ASM_SWITCH 1
// lt_sim_switch_stack(save, next): pushes the System V callee-saved registers on the current stack,
// stores the stack pointer in *save, switches to the stack pointer `next` (one saved the same way,
// or a fresh stack laid out by make_fiber_stack) and pops its registers; `ret` then continues
// wherever that stack was switched away from. The x87/SSE control words are not switched: kernels
// do not change them.
extern "C" void lt_sim_switch_stack(void** save, void* next);
asm(R"(
    .text
    .p2align 4
    .globl lt_sim_switch_stack
    .hidden lt_sim_switch_stack
    .type lt_sim_switch_stack, @function
lt_sim_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lt_sim_switch_stack, .-lt_sim_switch_stack
)");
#endif

namespace lt::sim {

thread_local uint3 thread_idx;
thread_local uint3 block_idx;
thread_local dim3 block_dim;
thread_local dim3 grid_dim;

namespace {

// Per-fiber stack. Kernels keep little on the stack; ASan's redzones need more. The top of fiber i's
// stack is lowered by stack_color(i) (under 64 KiB, added to the size): stacks of a power-of-two
// size put every fiber's hot top lines in the same cache sets, and switches missed; spread over the
// sets, a one-step cuda-sim training run of the tiny model took 18% less CPU time.
#if defined(LT_SIM_ASAN)
constexpr size_t kStackBytes = 512 * 1024 + 64 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024 + 64 * 1024;
#endif
// 64 cache lines within a page (L1's sets), then 16 pages (L2's): distinct for 1024 fibers.
constexpr size_t stack_color(size_t i) { return (i % 64) * 64 + (i / 64 % 16) * 4096; }

std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strfmt(const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "cuda_sim: %s (block %u,%u,%u thread %u,%u,%u)\n", what, block_idx.x, block_idx.y,
               block_idx.z, thread_idx.x, thread_idx.y, thread_idx.z);
  std::abort();
}

// The block's dynamic shared memory: exactly the launch's byte count, 16-byte aligned, so that
// under AddressSanitizer the first byte past the end is already a reported overflow.
struct SharedBytes {
  struct Free {
    void operator()(unsigned char* p) const { ::operator delete(p, std::align_val_t{16}); }
  };
  std::unique_ptr<unsigned char, Free> bytes;
  void assign(size_t n, unsigned char fill) {
    bytes.reset(static_cast<unsigned char*>(::operator new(n > 0 ? n : 1, std::align_val_t{16})));
    std::memset(bytes.get(), fill, n);
  }
  unsigned char* data() const { return bytes.get(); }
};

// A saved execution context: a fiber's, or the scheduler's (the OS thread's own stack).
struct Context {
#if defined(LT_SIM_ASM_SWITCH)
  void* sp = nullptr;  // saved stack pointer while switched out
#else
  ucontext_t ctx;
#endif
};

struct Fiber {
  Context context;
  uint3 tid;
  bool done = false;
  void* stack = nullptr;
  // While it waits at a barrier: that barrier's generation and the value it arrived in. The
  // scheduler passes over the fiber until the generation moves (resuming it would only re-check).
  const uint64_t* wait_generation = nullptr;
  uint64_t arrived_in = 0;
};

// A barrier by generation: arrivals are counted; the last expected arrival bumps the generation,
// which releases the waiters (they compare with the generation they arrived in).
struct Barrier {
  int arrived = 0;
  uint64_t generation = 0;
  const char* file = nullptr;  // block barrier: where the first arrival of this generation waits
  int line = 0;
  uint3 first{};               // ... and which thread that was
};

struct Warp {
  Barrier barrier;
  unsigned mask = 0;       // mask of the exchange in progress (all lanes must agree)
  unsigned present = 0;    // lanes that exist in this block
  unsigned live = 0;       // lanes that have not returned
  uint64_t fences = 0;     // completed __syncwarp()s (memory order among the lanes, for the race detector)
  // A shuffle's values, by the parity of the warp barrier's generation it arrives in (see warp_exchange).
  uint64_t values[2][kWarpSize] = {};
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier barrier;
  int live = 0;
  bool someone_returned = false;
  uint3 returned_tid{};  // the first thread that returned
  std::vector<int> order;  // this round's visiting order of the fibers
  size_t next = 0;        // the position in `order` the next fiber is looked for from
  Rng rng{0};             // the random schedule's stream (schedule_seed)
  bool progress = false;  // a fiber ran this round (one passed over at its barrier does not count)
  Fiber* current = nullptr;
  Context scheduler;      // run_block's, switched back to when the block's last fiber returns
  void (*entry)(void*) = nullptr;
  void* entry_ctx = nullptr;
  SharedBytes dynamic_smem;
#if defined(LT_SIM_ASAN)
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

// Fiber stacks are kept per OS thread and reused by every block and launch.
struct StackPool {
  std::vector<void*> stacks;
  ~StackPool() {
    for (void* s : stacks) munmap(s, kStackBytes);
  }
  void* get(size_t i) {
    while (stacks.size() <= i) {
      void* s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (s == MAP_FAILED) fail("cannot allocate a fiber stack");
      stacks.push_back(s);
    }
    return stacks[i];
  }
};

thread_local Block* t_block = nullptr;
thread_local uint64_t t_block_serial = 0;  // blocks started on this OS thread (block_serial())
thread_local StackPool t_stacks;

int linear_tid(const uint3& t) {
  return static_cast<int>(t.x + block_dim.x * (t.y + block_dim.y * t.z));
}

// ---- the schedule -------------------------------------------------------------------------------
std::mutex g_schedule_mu;
bool g_schedule_set = false;
Schedule g_schedule;
std::atomic<uint64_t> g_launches{0};
thread_local uint64_t t_launch = 0;  // the running launch's number, for its random stream

// The permutation of a round depends only on the seed, the launch number and the block (lt::Rng,
// splitmix64), so a failing order can be replayed.
uint64_t schedule_seed() {
  const Schedule s = current_schedule();
  const uint64_t block = block_idx.x + 65536ull * (block_idx.y + 65536ull * block_idx.z);
  return s.seed * 0x100000001b3ull ^ (t_launch << 40) ^ block;
}

// This round's order of the fibers: by index, reversed, or a fresh seeded permutation.
void visiting_order(std::vector<int>& order, Rng& rng) {
  const int n = static_cast<int>(order.size());
  const Order o = current_schedule().order;
  for (int i = 0; i < n; ++i) order[i] = o == Order::kReverse ? n - 1 - i : i;
  if (o == Order::kRandom) shuffle(order, rng);
}

// ---- the block subset (large index ranges) --------------------------------------------------------
std::atomic<uint64_t> g_subset_first{0}, g_subset_last{0};

bool block_in_subset(uint64_t linear, uint64_t n_blocks) {
  const uint64_t first = g_subset_first, last = g_subset_last;
  if (first == 0 && last == 0) return true;
  return linear < first || linear + last >= n_blocks;
}

// ---- barrier sites and fault injection ------------------------------------------------------------
std::mutex g_sites_mu;
std::set<std::pair<std::string, int>> g_sites;
std::string g_skip_file;
int g_skip_line = 0;

std::atomic<bool> g_skip_armed{false};  // skip_barrier named a site
// The sites this OS thread has registered, by the address of their __FILE__ literal: a barrier
// registers its site once, not at every arrival (a set insertion under a lock per __syncthreads
// took a tenth of a cuda-sim training run).
thread_local std::vector<std::pair<const char*, int>> t_registered_sites;

bool skipped_barrier(const char* file, int line) {
  bool registered = false;
  for (const auto& site : t_registered_sites) registered |= site.first == file && site.second == line;
  if (!registered) {
    std::lock_guard<std::mutex> lock(g_sites_mu);
    g_sites.emplace(file, line);
    t_registered_sites.emplace_back(file, line);
  }
  if (!g_skip_armed.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(g_sites_mu);
  if (g_skip_file.empty() || line != g_skip_line) return false;
  const std::string f = file;
  return f.size() >= g_skip_file.size() && f.compare(f.size() - g_skip_file.size(), g_skip_file.size(), g_skip_file) == 0;
}

// ---- launch limits ----------------------------------------------------------------------------------
// The limits common to sm_80 and sm_90 (CUDA C++ Programming Guide, "Technical Specifications per
// Compute Capability"): a launch valid here is valid on both. Dynamic shared memory above 48 KiB needs
// the per-kernel opt-in, up to 163 KiB on sm_80 (227 KiB on sm_90; the smaller one is checked).
struct Limits {
  unsigned max_grid_x = 2147483647u, max_grid_yz = 65535;
  unsigned max_block_xy = 1024, max_block_z = 64, max_threads = 1024;
  size_t default_dynamic_smem = 48 * 1024, max_optin_smem = 163 * 1024;
};
constexpr Limits kLimits;

std::mutex g_optin_mu;
std::map<const void*, size_t> g_optin;

void check_launch(const void* kernel, dim3 grid, dim3 block, size_t smem) {
  const long n_threads = static_cast<long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0)
    fail(strfmt("launch with an empty grid or block (grid %u,%u,%u block %u,%u,%u)", grid.x, grid.y, grid.z, block.x,
                block.y, block.z).c_str());
  if (grid.x > kLimits.max_grid_x || grid.y > kLimits.max_grid_yz || grid.z > kLimits.max_grid_yz)
    fail(strfmt("grid %u,%u,%u exceeds the device limits (x <= %u, y and z <= %u)", grid.x, grid.y, grid.z,
                kLimits.max_grid_x, kLimits.max_grid_yz).c_str());
  if (block.x > kLimits.max_block_xy || block.y > kLimits.max_block_xy || block.z > kLimits.max_block_z ||
      n_threads > kLimits.max_threads)
    fail(strfmt("block %u,%u,%u exceeds the device limits (x, y <= %u, z <= %u, at most %u threads)", block.x, block.y,
                block.z, kLimits.max_block_xy, kLimits.max_block_z, kLimits.max_threads).c_str());
  size_t allowed = kLimits.default_dynamic_smem;
  {
    std::lock_guard<std::mutex> lock(g_optin_mu);
    const auto it = g_optin.find(kernel);
    if (it != g_optin.end()) allowed = it->second;
  }
  if (smem > allowed)
    fail(strfmt("%zu bytes of dynamic shared memory, above the %zu this kernel may use (above 48 KiB a kernel must "
                "opt in with cudaFuncSetAttribute(MaxDynamicSharedMemorySize), lt::set_max_dynamic_smem)",
                smem, allowed).c_str());
}

// ---- switching between fibers ---------------------------------------------------------------------
// A fiber that waits at a barrier hands the OS thread straight to the next fiber of the round (one
// switch per wait, where going through a scheduler took two), and fibers whose barrier has not
// completed are passed over without a switch. The last fiber of a block to return switches back to
// run_block. Which fiber runs when is exactly as if a scheduler resumed every fiber once per round
// in the round's visiting order (visiting_order): the same rounds, the same random stream.

// Makes `f` the running thread: the built-in variables and what the race detector knows of it.
void enter(Block& b, Fiber& f) {
  b.current = &f;
  thread_idx = f.tid;
  RunningThread& r = t_running;
  r.tid = static_cast<uint32_t>(linear_tid(f.tid));
  r.warp_fence = &b.warps[r.tid / kWarpSize].fences;
  r.stack_lo = reinterpret_cast<uintptr_t>(f.stack);
  r.stack_hi = r.stack_lo + kStackBytes;
}

// Saves the running context in *save and continues `to`, whose stack starts at `to_bottom` (for
// ASan's fiber annotations). `save` null: the running fiber has returned and is never continued.
// Returns when another fiber switches back to *save.
__attribute__((noinline)) void switch_context(Context* save, Context& to, const void* to_bottom, size_t to_size) {
#if defined(LT_SIM_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(save != nullptr ? &fake_stack : nullptr, to_bottom, to_size);
#else
  (void)to_bottom, (void)to_size;
#endif
#if defined(LT_SIM_ASM_SWITCH)
  void* finished_sp = nullptr;  // a returned fiber's: never switched to
  lt_sim_switch_stack(save != nullptr ? &save->sp : &finished_sp, to.sp);
#else
  if (save != nullptr) {
    swapcontext(&save->ctx, &to.ctx);
  } else {
    setcontext(&to.ctx);
  }
#endif
#if defined(LT_SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// The next fiber to run: the next in this round's order that has not returned and does not wait at
// a barrier that has not completed. A round in which no fiber ran is a deadlock; each round gets a
// fresh order. Null once every fiber has returned.
Fiber* next_fiber(Block& b) {
  while (b.live > 0) {
    if (b.next == b.order.size()) {
      if (!b.progress) fail("deadlock: a barrier can never complete (divergent __syncthreads?)");
      b.progress = false;
      visiting_order(b.order, b.rng);
      b.next = 0;
    }
    Fiber& f = b.fibers[static_cast<size_t>(b.order[b.next++])];
    if (f.done || (f.wait_generation != nullptr && *f.wait_generation == f.arrived_in)) continue;
    b.progress = true;
    return &f;
  }
  return nullptr;
}

void switch_to(Block& b, Context* save, Fiber& next) {
  enter(b, next);
  switch_context(save, next.context, next.stack, kStackBytes);
}

void switch_to_scheduler(Block& b, Context* save) {
#if defined(LT_SIM_ASAN)
  switch_context(save, b.scheduler, b.scheduler_stack_bottom, b.scheduler_stack_size);
#else
  switch_context(save, b.scheduler, nullptr, 0);
#endif
}

// Arrive at `bar`, which completes when `expected` threads arrived; the others run until it does.
// Returns true for the arrival that completed it (which runs on before the others continue).
bool barrier_wait(Barrier& bar, int expected) {
  const uint64_t gen = bar.generation;
  if (++bar.arrived >= expected) {
    bar.arrived = 0;
    ++bar.generation;
    return true;
  }
  Block& b = *t_block;
  Fiber& me = *b.current;
  me.wait_generation = &bar.generation;
  me.arrived_in = gen;
  while (bar.generation == gen) {
    Fiber* next = next_fiber(b);  // never null: this fiber has not returned
    if (next != &me) switch_to(b, &me.context, *next);
  }
  me.wait_generation = nullptr;
  return false;
}

void fiber_main() {
  Block& b = *t_block;
#if defined(LT_SIM_ASAN)
  // The first fiber a block runs is entered from run_block: that is the stack to return to.
  const void* from_bottom = nullptr;
  size_t from_size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
  if (b.scheduler_stack_bottom == nullptr) b.scheduler_stack_bottom = from_bottom, b.scheduler_stack_size = from_size;
#endif
  b.entry(b.entry_ctx);
  // The thread returned: threads waiting at a barrier now wait for it in vain (barrier divergence);
  // it no longer takes part in its warp's operations.
  Fiber& f = *b.current;
  if (b.barrier.arrived > 0)
    fail(strfmt("barrier divergence: this thread returned while %d thread(s) wait at __syncthreads() at %s:%d "
                "(first: thread %u,%u,%u)",
                b.barrier.arrived, b.barrier.file, b.barrier.line, b.barrier.first.x, b.barrier.first.y,
                b.barrier.first.z)
             .c_str());
  if (!b.someone_returned) b.someone_returned = true, b.returned_tid = f.tid;
  f.done = true;
  --b.live;
  const int tid = linear_tid(f.tid);
  b.warps[tid / kWarpSize].live &= ~(1u << (tid % kWarpSize));
  // A returned fiber's ASan fake stack is released (switch_context with no context to save).
  Fiber* next = next_fiber(b);
  if (next != nullptr) {
    switch_to(b, nullptr, *next);
  } else {
    switch_to_scheduler(b, nullptr);
  }
  std::abort();  // unreachable: a returned fiber is never switched to again
}

// Kept out of line: getcontext/swapcontext "return twice", and the loops that call them would
// otherwise trip -Wclobbered (harmless here: the saved registers are restored unchanged).
#if defined(LT_SIM_ASM_SWITCH)
// A fresh fiber's stack, laid out as if lt_sim_switch_stack had switched away from it: six zeroed
// register slots, then the address the `ret` goes to (fiber_main), then one slot of padding so that
// fiber_main starts with the stack pointer at 8 mod 16, as after a call.
void init_fiber(Fiber& f, void* stack, size_t index) {
  f.done = false;
  f.stack = stack;
  f.wait_generation = nullptr;
#if defined(LT_SIM_ASAN)
  // The stack's previous fiber ended without unwinding, so its frames' redzones are still
  // poisoned (ASan's makecontext interceptor did this for the ucontext path).
  __asan_unpoison_memory_region(stack, kStackBytes);
#endif
  auto top = reinterpret_cast<uintptr_t>(stack) + kStackBytes - stack_color(index);
  top &= ~uintptr_t(15);
  auto* slots = reinterpret_cast<void**>(top);
  slots[-1] = nullptr;                                  // padding (fiber_main's "return address" slot)
  slots[-2] = reinterpret_cast<void*>(&fiber_main);    // where the first switch returns to
  for (int i = 3; i <= 8; ++i) slots[-i] = nullptr;     // rbp, rbx, r12..r15
  f.context.sp = &slots[-8];
}
#else
__attribute__((noinline)) void init_fiber(Fiber& f, void* stack, size_t /*index*/) {
  f.done = false;
  f.stack = stack;
  f.wait_generation = nullptr;
  getcontext(&f.context.ctx);
  f.context.ctx.uc_stack.ss_sp = stack;
  f.context.ctx.uc_stack.ss_size = kStackBytes;
  f.context.ctx.uc_link = nullptr;
  makecontext(&f.context.ctx, fiber_main, 0);
}
#endif

// Runs the block's threads to their end: the first fiber of the first round is switched to from
// here, and the last to return switches back.
void run_block(Block& b) {
  ++t_block_serial;
  const int n = static_cast<int>(b.fibers.size());
  for (int i = 0; i < n; ++i) init_fiber(b.fibers[i], t_stacks.get(i), size_t(i));
  for (auto& w : b.warps) {
    w.barrier = Barrier{};
    w.live = w.present;
  }
  b.barrier = Barrier{};
  b.live = n;
  b.someone_returned = false;
  b.order.resize(n);
  b.rng = Rng(schedule_seed());
  b.next = b.order.size();  // next_fiber starts the first round
  b.progress = true;
  switch_to(b, &b.scheduler, *next_fiber(b));
  t_running.warp_fence = nullptr;  // back in the simulator's own code: no simulated thread runs
  race::interval_ended();
}

}  // namespace

void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem_bytes, void (*entry)(void*), void* ctx) {
  if (t_block != nullptr) fail("a kernel launched from inside a kernel");
  check_launch(kernel, grid, block, dynamic_smem_bytes);
  const long n_threads = static_cast<long>(block.x) * block.y * block.z;
  t_launch = g_launches++;

  Block b;
  b.entry = entry;
  b.entry_ctx = ctx;
  b.fibers.resize(n_threads);
  b.warps.resize((n_threads + kWarpSize - 1) / kWarpSize);
  grid_dim = grid;
  block_dim = block;
  int i = 0;
  for (unsigned z = 0; z < block.z; ++z)
    for (unsigned y = 0; y < block.y; ++y)
      for (unsigned x = 0; x < block.x; ++x, ++i) {
        b.fibers[i].tid = uint3{x, y, z};
        b.warps[i / kWarpSize].present |= 1u << (i % kWarpSize);
      }

  t_block = &b;
  race::launch_started();
  t_running = RunningThread{};
  t_running.in_kernel = true;
  t_running.kernel = kernel;
  t_running.launch = static_cast<uint32_t>(t_launch + 1);
  t_running.interval = &b.barrier.generation;
  t_running.smem_bytes = dynamic_smem_bytes;
  const uint64_t n_blocks = uint64_t(grid.x) * grid.y * grid.z;
  uint64_t linear = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x, ++linear) {
        if (!block_in_subset(linear, n_blocks)) continue;
        block_idx = uint3{x, y, z};
        // Every block starts with poisoned dynamic shared memory (0xff bytes: NaN as floats), so a
        // kernel that reads before writing, or reads what an earlier block left, sees garbage.
        b.dynamic_smem.assign(dynamic_smem_bytes, 0xff);
        t_running.block = static_cast<uint32_t>(linear);
        t_running.smem = b.dynamic_smem.data();
        run_block(b);
      }
  t_block = nullptr;
  t_running = RunningThread{};
}

unsigned char* dynamic_smem() {
  return t_block->dynamic_smem.data();
}

void set_max_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes > kLimits.max_optin_smem)
    fail(strfmt("cudaFuncSetAttribute: %zu bytes of dynamic shared memory, above the opt-in maximum %zu of sm_80",
                bytes, kLimits.max_optin_smem).c_str());
  std::lock_guard<std::mutex> lock(g_optin_mu);
  g_optin[kernel] = bytes;
}

Schedule parse_schedule(const char* text) {
  const std::string t = text ? text : "";
  if (t.empty() || t == "forward") return Schedule{Order::kForward, 0};
  if (t == "reverse") return Schedule{Order::kReverse, 0};
  if (t == "random") return Schedule{Order::kRandom, 1};
  if (t.rfind("random:", 0) == 0) {
    size_t used = 0;
    const uint64_t seed = std::stoull(t.substr(7), &used);
    if (used == t.size() - 7) return Schedule{Order::kRandom, seed};
  }
  throw std::invalid_argument("LT_SIM_SCHEDULE: '" + t + "', expected forward, reverse or random:SEED");
}

void set_schedule(Schedule s) {
  std::lock_guard<std::mutex> lock(g_schedule_mu);
  g_schedule = s;
  g_schedule_set = true;
}

Schedule current_schedule() {
  std::lock_guard<std::mutex> lock(g_schedule_mu);
  if (!g_schedule_set) {
    try {
      g_schedule = parse_schedule(std::getenv("LT_SIM_SCHEDULE"));
    } catch (const std::invalid_argument& e) {
      fail(e.what());
    }
    g_schedule_set = true;
  }
  return g_schedule;
}

void set_block_subset(uint64_t first, uint64_t last) {
  g_subset_first = first;
  g_subset_last = last;
}

void skip_barrier(const char* file, int line) {
  std::lock_guard<std::mutex> lock(g_sites_mu);
  g_skip_file = file ? file : "";
  g_skip_line = line;
  g_skip_armed.store(!g_skip_file.empty(), std::memory_order_release);
}

std::vector<std::pair<std::string, int>> barrier_sites() {
  std::lock_guard<std::mutex> lock(g_sites_mu);
  return {g_sites.begin(), g_sites.end()};
}

void syncthreads(const char* file, int line) {
  Block& b = *t_block;
  if (skipped_barrier(file, line)) return;
  if (b.someone_returned)
    fail(strfmt("barrier divergence: __syncthreads() at %s:%d is reached after thread %u,%u,%u returned", file, line,
                b.returned_tid.x, b.returned_tid.y, b.returned_tid.z).c_str());
  if (b.barrier.arrived == 0) {
    b.barrier.file = file, b.barrier.line = line, b.barrier.first = thread_idx;
  } else if (b.barrier.line != line || (b.barrier.file != file && std::strcmp(b.barrier.file, file) != 0)) {
    fail(strfmt("barrier divergence: this thread waits at __syncthreads() at %s:%d, thread %u,%u,%u at %s:%d", file,
                line, b.barrier.first.x, b.barrier.first.y, b.barrier.first.z, b.barrier.file, b.barrier.line).c_str());
  }
  if (barrier_wait(b.barrier, b.live)) race::interval_ended();
}

// The running fiber's linear index, set by resume (t_running.tid).
int lane_id() { return static_cast<int>(t_running.tid % kWarpSize); }

namespace {

Warp& own_warp(unsigned mask) {
  Block& b = *t_block;
  const int tid = static_cast<int>(t_running.tid);
  Warp& w = b.warps[tid / kWarpSize];
  if (!(mask & (1u << (tid % kWarpSize)))) fail("warp operation by a lane not in its mask");
  if ((mask & w.present) != mask) fail("warp mask names a lane that does not exist in this block");
  if ((mask & w.live) != mask) fail("warp mask names a lane that has returned");
  if (w.barrier.arrived == 0) {
    w.mask = mask;
  } else if (w.mask != mask) {
    fail("lanes of one warp use different masks in the same warp operation");
  }
  return w;
}

}  // namespace

void syncwarp(unsigned mask) {
  Warp& w = own_warp(mask);
  // The last lane to arrive counts the fence before any lane runs on.
  if (barrier_wait(w.barrier, __builtin_popcount(mask))) ++w.fences;
}

// One barrier per shuffle: every lane writes its value into the buffer of the generation it arrives
// in and reads its partner's after the barrier. The next warp operation arrives in the next
// generation (the other buffer); a lane can reach the one after that (this buffer again) only once
// every lane arrived at the next one, so after every lane has read this one.
uint64_t warp_exchange(unsigned mask, uint64_t value, int src_lane) {
  const int lane = lane_id();
  Warp& w = own_warp(mask);
  uint64_t* values = w.values[w.barrier.generation & 1];
  values[lane] = value;
  barrier_wait(w.barrier, __builtin_popcount(mask));  // every lane has written
  if (src_lane < 0 || src_lane >= kWarpSize || !(mask & (1u << src_lane)))
    fail("shuffle reads a lane outside its mask (undefined on the device)");
  return values[src_lane];
}

}  // namespace lt::sim

// ---- warp-collective instructions ----------------------------------------------------------------
namespace lt::sim {

namespace {

// What each lane of a warp published for the warp_gather in progress, and where it arrived (the
// block and the warp barrier's generation), so that lanes at some other warp operation are seen.
struct GatherStage {
  std::vector<unsigned char> bytes;
  const char* instruction[kWarpSize] = {};
  size_t size[kWarpSize] = {};
  uint64_t serial[kWarpSize] = {};
  uint64_t generation[kWarpSize] = {};
  // The gather whose lanes were found to agree (block serial, generation): the first lane past the
  // barrier compares them all, and equality is transitive, so the others need not.
  uint64_t checked_serial = 0, checked_generation = 0;
};
thread_local std::vector<GatherStage> t_gather;

}  // namespace

uint64_t block_serial() { return t_block_serial; }

void fail_kernel(const char* what) { fail(what); }

void warp_gather(const char* instruction, const void* mine, size_t bytes, void* all_lanes) {
  constexpr unsigned kAll = 0xffffffffu;
  Block& b = *t_block;
  const int tid = static_cast<int>(t_running.tid);
  const int lane = tid % kWarpSize;
  const size_t warp = static_cast<size_t>(tid / kWarpSize);
  char msg[256];
  if (b.warps[warp].present != kAll || b.warps[warp].live != kAll) {
    std::snprintf(msg, sizeof msg, "%s needs all 32 lanes of the warp: lanes 0x%08x exist, 0x%08x have not returned",
                  instruction, b.warps[warp].present, b.warps[warp].live);
    fail(msg);
  }
  Warp& w = own_warp(kAll);
  // Two stages per warp, by the parity of the generation the lanes arrive in: one barrier per
  // gather, for the reason warp_exchange gives.
  if (t_gather.size() < 2 * b.warps.size()) t_gather.resize(2 * b.warps.size());
  GatherStage& g = t_gather[2 * warp + (w.barrier.generation & 1)];
  if (g.bytes.size() < kWarpSize * bytes) g.bytes.resize(kWarpSize * bytes);
  std::memcpy(g.bytes.data() + lane * bytes, mine, bytes);
  g.instruction[lane] = instruction;
  g.size[lane] = bytes;
  g.serial[lane] = t_block_serial;
  g.generation[lane] = w.barrier.generation;
  barrier_wait(w.barrier, kWarpSize);  // every lane has written
  const bool checked = g.checked_serial == t_block_serial && g.checked_generation == g.generation[lane];
  for (int l = 0; l < kWarpSize && !checked; ++l) {
    if (g.serial[l] != t_block_serial || g.generation[l] != g.generation[lane] || g.size[l] != bytes ||
        g.instruction[l] == nullptr ||
        (g.instruction[l] != instruction && std::strcmp(g.instruction[l], instruction) != 0)) {
      std::snprintf(msg, sizeof msg, "%s is .aligned: lane %d of the warp is not at the same instruction", instruction,
                    l);
      fail(msg);
    }
  }
  g.checked_serial = t_block_serial;
  g.checked_generation = g.generation[lane];
  std::memcpy(all_lanes, g.bytes.data(), kWarpSize * bytes);
}

}  // namespace lt::sim
