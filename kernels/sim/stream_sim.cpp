// Streams and events of the CUDA execution simulator: per-stream queues run at synchronisation
// points in a seeded order across streams. See stream_sim.h for the model.
#include "sim/stream_sim.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

#include "llamatrain/rng.h"

namespace lt::sim {

struct EventState {
  uint64_t issued = 0;     // records issued so far; record n is done[n - 1]
  std::vector<bool> done;
};
struct Event {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

namespace {

struct Op {
  enum class Kind { kWork, kRecord, kWait } kind = Kind::kWork;
  uint64_t serial = 0;  // issue number, over all streams
  std::string what;
  Access access;
  std::function<void()> run;
  std::function<bool()> done;  // start_in_order's: run() started it; it stays at the head until done()
  bool started = false;
  std::shared_ptr<EventState> event;  // kRecord: the event it completes; kWait: the one it waits for
  uint64_t record = 0;                // ... and which of its records (0: none, a wait that is a no-op)
};

struct Stream {
  int id = 0;  // 0: the default stream; others in creation order
  std::deque<Op> queue;
};

struct State {
  bool queued = false;
  bool running = false;  // an operation is executing (it may not synchronise)
  bool skip_waits = false;
  bool order_set = false;
  Schedule order;
  Rng rng{0};
  Stream default_stream;
  std::vector<Stream*> streams{&default_stream};  // live streams, the default one first
  int next_id = 1;
  uint64_t next_serial = 0;
};

// Never destroyed: device buffers held by statics are freed (and synchronise) at exit.
State& state() {
  static State* s = new State;
  return *s;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "cuda_sim streams: %s\n", what.c_str());
  std::abort();
}

Stream& stream_of(cudaStream_t s) {
  return s ? *reinterpret_cast<Stream*>(s) : state().default_stream;
}

bool ready(const Op& op) {
  if (op.started) return op.done();
  if (op.kind != Op::Kind::kWait || op.record == 0) return true;
  return op.event->done[op.record - 1];
}

bool in_flight() {
  for (const Stream* s : state().streams)
    if (!s->queue.empty() && s->queue.front().started) return true;
  return false;
}

bool idle() {
  for (const Stream* s : state().streams)
    if (!s->queue.empty()) return false;
  return true;
}

// The stream whose head runs next, by the stream order, among those whose head is ready. With
// none ready but an operation in flight (start_in_order), waits for one to complete.
Stream& pick() {
  State& st = state();
  std::vector<Stream*> candidates;
  for (std::chrono::microseconds pause{1};; pause = std::min(pause * 2, std::chrono::microseconds{100})) {
    for (Stream* s : st.streams)
      if (!s->queue.empty() && ready(s->queue.front())) candidates.push_back(s);
    if (!candidates.empty()) break;
    if (!in_flight()) fail("deadlock: every queued stream waits for an event that can never complete");
    std::this_thread::sleep_for(pause);
  }
  const Order order = current_stream_order().order;
  if (order == Order::kRandom) return *candidates[st.rng.below(candidates.size())];
  auto earlier = [](const Stream* a, const Stream* b) { return a->queue.front().serial < b->queue.front().serial; };
  return order == Order::kForward ? **std::min_element(candidates.begin(), candidates.end(), earlier)
                                  : **std::max_element(candidates.begin(), candidates.end(), earlier);
}

void run_work(const Op& op) {
  // Cleared however run() ends: a collective may throw (an MPI error), and the host may go on.
  struct Running {
    Running() { state().running = true; }
    ~Running() { state().running = false; }
  } running;
  op.run();
}

void run_one(Stream& s) {
  Op& head = s.queue.front();
  if (head.done && !head.started) {  // start_in_order's: starts, and stays until done
    head.started = true;
    return run_work(head);
  }
  Op op = std::move(head);
  s.queue.pop_front();
  if (op.kind == Op::Kind::kRecord) op.event->done[op.record - 1] = true;
  if (op.kind == Op::Kind::kWork && !op.started) run_work(op);
}

// Runs queued operations, one at a time in the stream order, until done() holds.
template <class Done>
void run_until(Done done) {
  if (state().running) fail("a synchronisation from inside a queued operation");
  while (!done()) run_one(pick());
}

void push(cudaStream_t s, Op op) {
  State& st = state();
  op.serial = st.next_serial++;
  stream_of(s).queue.push_back(std::move(op));
  if (!st.queued) run_until(idle);
}

bool overlaps(const std::vector<Range>& ranges, const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const Range& r : ranges) {
    const auto b = reinterpret_cast<uintptr_t>(r.p);
    if (r.bytes > 0 && bytes > 0 && a < b + r.bytes && b < a + bytes) return true;
  }
  return false;
}

// Work still queued on a stream other than the default one (which the host access waited for)
// that writes (and, for a host write, reads) [p, p + bytes): a race, reported with both sides.
void check_host_access(const void* p, size_t bytes, const char* what, bool host_writes) {
  for (const Stream* s : state().streams) {
    for (const Op& op : s->queue) {
      if (op.started && op.done()) continue;  // complete; only not yet taken off its stream
      const Access& a = op.access;
      const bool hit = a.everything || overlaps(a.writes, p, bytes) || (host_writes && overlaps(a.reads, p, bytes));
      if (!hit) continue;
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "the host %s %zu bytes at %p (%s) while '%s', queued on stream %d and not waited for, %s them: "
                    "synchronise that stream (or make the default stream wait for it) first",
                    host_writes ? "writes" : "reads", bytes, p, what, op.what.c_str(), s->id,
                    a.everything ? "may access (a kernel's accesses are not known)"
                                 : host_writes ? "accesses" : "writes");
      fail(msg);
    }
  }
}

}  // namespace

void set_queued_streams(bool on) {
  if (!on) device_synchronize();
  state().queued = on;
}
bool queued_streams() { return state().queued; }

void set_stream_order(Schedule s) {
  State& st = state();
  st.order = s;
  st.order_set = true;
  st.rng = Rng(s.seed);
}

Schedule current_stream_order() {
  State& st = state();
  if (!st.order_set) {
    const char* env = std::getenv("LT_SIM_STREAM_ORDER");
    try {
      set_stream_order(parse_schedule(env));
    } catch (const std::exception&) {
      fail(std::string("LT_SIM_STREAM_ORDER: '") + env + "', expected forward, reverse or random:SEED");
    }
  }
  return st.order;
}

cudaStream_t stream_create() {
  State& st = state();
  auto* s = new Stream;
  s->id = st.next_id++;
  st.streams.push_back(s);
  return reinterpret_cast<cudaStream_t>(s);
}

void stream_destroy(cudaStream_t s) {
  if (!s) return;
  stream_synchronize(s);
  auto& v = state().streams;
  v.erase(std::find(v.begin(), v.end(), &stream_of(s)));
  delete &stream_of(s);
}

Event* event_create() { return new Event; }
void event_destroy(Event* e) { delete e; }

void event_record(Event* e, cudaStream_t s) {
  EventState& ev = *e->state;
  ev.done.push_back(false);
  Op op;
  op.kind = Op::Kind::kRecord;
  op.what = "event record";
  op.event = e->state;
  op.record = ++ev.issued;
  push(s, std::move(op));
}

void stream_wait_event(cudaStream_t s, Event* e) {
  if (state().skip_waits) return;
  Op op;
  op.kind = Op::Kind::kWait;
  op.what = "stream wait event";
  op.event = e->state;
  op.record = e->state->issued;
  push(s, std::move(op));
}

void event_synchronize(Event* e) {
  const EventState& ev = *e->state;
  const uint64_t n = ev.issued;
  run_until([&] { return n == 0 || ev.done[n - 1]; });
}

void stream_synchronize(cudaStream_t s) {
  const Stream& st = stream_of(s);
  run_until([&] { return st.queue.empty(); });
}

void device_synchronize() { run_until(idle); }

void enqueue(cudaStream_t s, std::string what, Access access, std::function<void()> run) {
  Op op;
  op.what = std::move(what);
  op.access = std::move(access);
  op.run = std::move(run);
  push(s, std::move(op));
}

void start_in_order(cudaStream_t s, std::string what, Access access, std::function<void()> start,
                    std::function<bool()> done) {
  auto started = std::make_shared<bool>(false);
  Op op;
  op.what = std::move(what);
  op.access = std::move(access);
  op.run = [start = std::move(start), started] {
    start();
    *started = true;
  };
  op.done = std::move(done);
  push(s, std::move(op));
  run_until([&] { return *started; });
}

void enqueue_kernel(cudaStream_t s, dim3 grid, dim3 block, std::function<void()> run) {
  char what[128];
  std::snprintf(what, sizeof what, "kernel launch (grid %u,%u,%u block %u,%u,%u)", grid.x, grid.y, grid.z, block.x,
                block.y, block.z);
  Access all;
  all.everything = true;
  enqueue(s, what, std::move(all), std::move(run));
}

void memcpy_async(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  Access a;
  a.reads = {Range{src, bytes}};
  a.writes = {Range{dst, bytes}};
  enqueue(s, "memcpy", std::move(a), [=] {
    if (bytes) std::memcpy(dst, src, bytes);
  });
}

void memset_async(void* p, int value, size_t bytes, cudaStream_t s) {
  Access a;
  a.writes = {Range{p, bytes}};
  enqueue(s, "memset", std::move(a), [=] {
    if (bytes) std::memset(p, value, bytes);
  });
}

void host_read(const void* p, size_t bytes, const char* what) {
  stream_synchronize(nullptr);
  check_host_access(p, bytes, what, false);
}

void host_write(const void* p, size_t bytes, const char* what) {
  stream_synchronize(nullptr);
  check_host_access(p, bytes, what, true);
}

void skip_stream_waits(bool on) { state().skip_waits = on; }

}  // namespace lt::sim
