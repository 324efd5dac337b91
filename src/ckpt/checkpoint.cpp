#include "llamatrain/checkpoint.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_sums.h"
#include "llamatrain/dataset.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/h5_attrs.h"
#include "llamatrain/json_read.h"

namespace lt {

namespace {

constexpr const char* kFormat = "llamatrain-checkpoint";
// 3: XXH3-64 piece sums, checksums.xxh3 over every file, the run's stamp in every rank file.
// 2: the model config as numeric attributes, split and rank files as lists, the training options
// as the /training group; 1 held them as strings ("dim=64 ...", "3,3", JSON). All three are read.
constexpr int64_t kFormatVersion = 3;
constexpr int64_t kOldestFormatVersion = 1;
constexpr const char* kArrays[3] = {"weights", "adam_m", "adam_v"};

uint64_t load64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}
std::string rank_file_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.h5", r);
  return buf;
}

using Piece = CheckpointWriter::Piece;

std::vector<Piece> pieces_of(const TensorTable& layout, size_t begin, size_t end) {
  std::vector<Piece> out;
  const auto& ts = layout.tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const size_t b = std::max(begin, ts[i].offset), e = std::min(end, ts[i].offset + ts[i].numel);
    if (b < e) out.push_back({int64_t(i), b, e - b});
  }
  return out;
}

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> v;
  size_t start = 0;
  while (start < s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    v.push_back(std::atoi(s.substr(start, comma - start).c_str()));
    start = comma + 1;
  }
  return v;
}

// The blocks of a tensor (shape `shape`) that elements [a, z) of its flattening cover, in order:
// a partial first row, whole rows, a partial last row (one block for a 1-D tensor).
void row_blocks(const std::vector<int64_t>& shape, uint64_t a, uint64_t z,
                const std::function<void(h5::Dims, h5::Dims, uint64_t)>& emit) {
  if (shape.size() == 1) {
    emit({a}, {z - a}, 0);
    return;
  }
  const uint64_t cols = uint64_t(shape[1]);
  uint64_t done = 0;
  while (a < z) {
    const uint64_t row = a / cols, col = a % cols;
    if (col != 0 || z - a < cols) {
      const uint64_t n = std::min(cols - col, z - a);
      emit({row, col}, {1, n}, done);
      a += n, done += n;
    } else {
      const uint64_t rows = (z - a) / cols;
      emit({row, 0}, {rows, cols}, done);
      a += rows * cols, done += rows * cols;
    }
  }
}

// The background writer runs at SCHED_IDLE: it gets a core only when training leaves one idle
// (a GPU run leaves most idle; on the CPU backend the OpenMP threads sleep between regions), so
// the checkpoint slows training as little as possible and takes longer itself instead.
void lower_thread_priority() {
  sched_param param{};
  param.sched_priority = 0;
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);  // best effort: ignore a refusal
}

using Snapshot = std::vector<float, BlockAlignedAllocator<float>>;

// O_DIRECT needs the file offset, the length and the memory address aligned to the device's
// logical block size; 4096 covers both sizes in use (512 and 4096).
constexpr uint64_t kDirectBlock = 4096;

using ckpt::RawRegion;  // the bytes of one array and where HDF5 reserved their storage

// Returns 0 or the errno of the first failing pwrite; a short write is continued.
int pwrite_all(int fd, const char* p, uint64_t n, uint64_t off) {
  // At most 64 MiB per call: one call already keeps the device queue full, and a bounded call
  // bounds the memory the kernel pins for a direct write.
  constexpr uint64_t kMaxCall = uint64_t(64) << 20;
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min(n, kMaxCall), off_t(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w, n -= uint64_t(w), off += uint64_t(w);
  }
  return 0;
}

// Closes a file descriptor on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Writes each region's bytes at its offset of the (closed) HDF5 file `path`. The block-aligned
// body goes through O_DIRECT: the kernel then sends our buffer to the disk without first copying
// it into the page cache, and that copy was most of a checkpoint's write time (perf:
// copy_folio_from_iter_atomic); the tail that is not a whole block, and everything where O_DIRECT
// is refused, by ordinary writes. The caller fsyncs the file afterwards (the direct writes'
// block allocations are metadata that only fsync makes durable). Returns "direct" or
// "buffered (<why>)".
std::string write_regions(const std::string& path, const std::vector<RawRegion>& regions) {
  Fd buffered, direct;
  buffered.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (buffered.fd < 0) fail(strcat(path, ": cannot open to write the arrays (", std::strerror(errno), ")"));
  std::string why;
  if (const char* env = std::getenv("LLAMATRAIN_CHECKPOINT_BUFFERED"); env && *env && std::strcmp(env, "0") != 0) {
    why = "LLAMATRAIN_CHECKPOINT_BUFFERED is set";
  } else {
    direct.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
    if (direct.fd < 0) why = strcat("O_DIRECT open refused: ", std::strerror(errno));
  }
  for (const RawRegion& r : regions) {
    uint64_t body = 0;  // bytes written directly, from the start of the region
    if (direct.fd >= 0) {
      if (reinterpret_cast<uintptr_t>(r.data) % kDirectBlock != 0 || r.offset % kDirectBlock != 0)
        fail(strcat(path, ": an array's buffer or file offset ", r.offset, " is not ", kDirectBlock,
                    "-byte aligned (expected from BlockAlignedAllocator and H5Pset_alignment)"));
      body = r.bytes / kDirectBlock * kDirectBlock;
      if (const int err = pwrite_all(direct.fd, r.data, body, r.offset); err != 0) {
        // EINVAL: the file system takes no direct writes (or wants a larger alignment); anything
        // the direct writes already put there is rewritten below with the same bytes.
        if (err != EINVAL)
          fail(strcat(path, ": cannot write ", body, " bytes at offset ", r.offset, " (", std::strerror(err), ")"));
        why = strcat("O_DIRECT write refused: ", std::strerror(err));
        ::close(direct.fd);
        direct.fd = -1;
        body = 0;
      }
    }
    if (const int err = pwrite_all(buffered.fd, r.data + body, r.bytes - body, r.offset + body); err != 0)
      fail(strcat(path, ": cannot write ", r.bytes - body, " bytes at offset ", r.offset + body, " (",
                  std::strerror(err), ")"));
  }
  if (direct.fd >= 0 && why.empty()) return "direct";
  return strcat("buffered (", why, ")");
}

int64_t test_delay_ms() {
  // For tests only: a pause inside the background write, so a test can kill a rank mid-write.
  const char* env = std::getenv("LLAMATRAIN_TEST_CHECKPOINT_DELAY_MS");
  return env ? std::atoll(env) : 0;
}

}  // namespace

uint64_t checksum64(const void* data, size_t n) {
  constexpr uint64_t k1 = 0x9E3779B97F4A7C15ull, k2 = 0xC2B2AE3D27D4EB4Full;
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h[4] = {k1, k2, k1 ^ k2, k2 - k1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) h[l] = rotl(h[l] ^ (load64(p + i + 8 * l) * k2), 31) * k1;
  for (; i + 8 <= n; i += 8) h[0] = rotl(h[0] ^ (load64(p + i) * k2), 31) * k1;
  uint64_t tail = 0;
  for (size_t j = 0; i < n; ++i, ++j) tail |= uint64_t(p[i]) << (8 * j);
  h[1] = rotl(h[1] ^ (tail * k2), 31) * k1;
  uint64_t r = uint64_t(n) * k1;
  for (uint64_t x : h) {
    r = (r ^ x) * k2;
    r ^= r >> 29;
  }
  return r;
}

std::string dataset_identity(const Dataset& ds) {
  return strcat("source sha256 ", ds.info.source_sha256, ", tokenizer sha256 ", ds.info.tokenizer_sha256,
                ", seq_len ", ds.info.seq_len, ", ", ds.train.n_seq, " train rows, ", ds.train.loss_tokens(),
                " loss tokens");
}

namespace {

// The run's stamp: what a resume trusts to continue the run, written alike into checkpoint.h5 and
// (format 3) every rank file, so that a load can cross-check them.
void write_run_stamp(h5::File& f, const CheckpointInfo& info, int world_size) {
  f.write_attr("/", "format_version", kFormatVersion);
  f.write_attr("/", "step", info.step);
  f.write_attr("/", "epoch", info.epoch);
  f.write_attr("/", "world_size", int64_t(world_size));
  f.write_attr("/", "zero_stage", int64_t(info.zero_stage));
  f.write_attr("/", "seed", int64_t(info.seed));
  f.write_attr("/", "global_batch", info.global_batch);
  f.write_attr_ints("/", "split", std::vector<int64_t>(info.split.begin(), info.split.end()));
  f.write_attr("/", "data_identity", info.data_identity);
}

// The stamp of a file of format 3 as (attribute, value as text) pairs, in a fixed order.
std::vector<std::pair<std::string, std::string>> read_run_stamp(const h5::File& f) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : {"format_version", "step", "epoch", "world_size", "zero_stage", "seed", "global_batch"})
    out.emplace_back(name, std::to_string(f.read_attr_int("/", name)));
  std::string split;
  for (int64_t k : f.read_attr_ints("/", "split")) split += (split.empty() ? "" : ",") + std::to_string(k);
  out.emplace_back("split", split);
  out.emplace_back("data_identity", f.read_attr_string("/", "data_identity"));
  return out;
}

// Any disagreement between a rank file's stamp and checkpoint.h5's is damage in one of them.
void check_run_stamp(const h5::File& rank_file, const std::vector<std::pair<std::string, std::string>>& master) {
  const auto mine = read_run_stamp(rank_file);
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i].second != master[i].second)
      fail(strcat(rank_file.path(), ": ", mine[i].first, " is ", mine[i].second, " there but ", master[i].second,
                  " in checkpoint.h5 (damaged checkpoint)"));
}

// checkpoint.h5's attributes: what resume checks and needs, the model config (as model.h5 has
// it), the rank files and their ranges, and the /training record.
void write_master_attrs(h5::File& f, const CheckpointInfo& info, int world_size, const std::vector<size_t>& shard_begin,
                        const std::vector<size_t>& shard_end) {
  f.write_attr("/", "format", std::string(kFormat));
  f.write_attr("/", "tool_version", std::string(LLAMATRAIN_VERSION));
  write_run_stamp(f, info, world_size);
  write_model_config_attrs(f, "/", Llama2Config::from_string(info.model_config, "checkpoint model config"));
  f.write_attr("/", "tokenizer_sha256", info.tokenizer_sha256);
  f.write_attr("/", "rng", std::string("none beyond the seed: the data order is a function of (seed, epoch) "
                                       "and training draws no random numbers"));
  std::vector<std::string> names;
  for (int r = 0; r < world_size; ++r) names.push_back(rank_file_name(r));
  f.write_attr_strings("/", "rank_files", names);
  f.write_attr_ints("/", "rank_begin", std::vector<int64_t>(shard_begin.begin(), shard_begin.end()));
  f.write_attr_ints("/", "rank_end", std::vector<int64_t>(shard_end.begin(), shard_end.end()));
  write_training_record(f, "/training", info.training);
  if (!info.lora.empty()) f.write_attr("/", "lora", info.lora);
  if (info.best_eval_step >= 0) {
    f.write_attr("/", "best_eval_step", info.best_eval_step);
    f.write_attr("/", "best_eval_loss", info.best_eval_loss);
  }
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string dir, int rank, int world_size, int keep_last)
    : dir_(std::move(dir)), rank_(rank), world_size_(world_size), keep_last_(keep_last) {}

CheckpointWriter::~CheckpointWriter() { join(); }

void CheckpointWriter::join() {
  if (worker_.joinable()) worker_.join();
  copy_pending_ = false;  // a finished worker has finished its copy
}

double CheckpointWriter::start(const CheckpointInfo& info, const TensorTable& layout, const ShardView& view,
                               const std::string& tokenizer_model) {
  join();  // a publication (rank 0) or write still running
  const auto t0 = std::chrono::steady_clock::now();
  info_ = info;
  tokenizer_ = tokenizer_model;
  names_.clear(), shapes_.clear(), offsets_.clear();
  for (const auto& t : layout.tensors()) {
    names_.push_back(t.name);
    shapes_.push_back(t.shape);
    offsets_.push_back(t.offset);
  }
  const std::vector<Piece> pieces = pieces_of(layout, view.begin, view.end);
  pending_step_ = info.step;
  error_.clear();
  state_ = kWriting;
  {
    std::lock_guard<std::mutex> lock(copy_mutex_);
    copied_ = false;
  }
  copy_pending_ = true;
  const double start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  worker_ = std::thread([this, pieces, view] {
    const size_t begin = view.begin, end = view.end;
    // The snapshot, on this thread while the training thread computes the next step's forward
    // and backward passes (which only read the weights): the trainer calls wait_snapshot()
    // before its optimizer update changes them. At normal priority, since training may be
    // waiting for it; into buffers kept from the last checkpoint (the first one allocates).
    const auto t_copy = std::chrono::steady_clock::now();
    bool copied = false;
    try {
      const size_t n = end - begin;
      weights_.resize(n), m_.resize(n), v_.resize(n);
      if (n > 0) {
        std::memcpy(weights_.data(), view.params, n * sizeof(float));
        std::memcpy(m_.data(), view.m, n * sizeof(float));
        std::memcpy(v_.data(), view.v, n * sizeof(float));
      }
      copied = true;
    } catch (const std::exception& e) {
      error_ = strcat("snapshot: ", e.what());
    }
    copy_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_copy).count();
    {
      std::lock_guard<std::mutex> lock(copy_mutex_);
      copied_ = true;
    }
    copy_done_.notify_all();
    if (!copied) {
      state_ = kFailed;
      return;
    }
    lower_thread_priority();
    const auto t_write = std::chrono::steady_clock::now();
    try {
      write_shard(pieces, begin, end);
      write_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count();
      state_ = kWritten;
    } catch (const std::exception& e) {
      error_ = e.what();
      state_ = kFailed;
    }
  });
  return start_s;
}

// This rank's file: the stamp and the piece tables through HDF5, which reserves the arrays'
// storage; then the arrays' bytes (write_regions), an fsync, and the XXH3 of the whole file.
void CheckpointWriter::write_shard(const std::vector<Piece>& pieces, size_t begin, size_t end) {
  const std::string tmp_dir = dir_ + "/." + step_name(info_.step) + ".tmp";
  make_dirs(tmp_dir);
  const std::string path = tmp_dir + "/" + rank_file_name(rank_);
  std::vector<RawRegion> regions;
  {
    // Datasets of a block or more start on a block boundary, so the arrays can be written
    // directly; the small tables and attributes stay packed.
    h5::File f = h5::File::create_aligned(path, kDirectBlock, kDirectBlock);
    f.write_attr("/", "format", std::string(kFormat) + "-shard");
    f.write_attr("/", "rank", int64_t(rank_));
    f.write_attr("/", "begin", int64_t(begin));
    f.write_attr("/", "end", int64_t(end));
    write_run_stamp(f, info_, world_size_);
    f.write_attr("/", "checksum", std::string("XXH3-64 (seed 0) of each piece's bytes as stored"));
    std::vector<int64_t> tensor;
    std::vector<uint64_t> offset, count;
    for (const Piece& p : pieces) tensor.push_back(p.tensor), offset.push_back(p.offset), count.push_back(p.count);
    f.write("/piece_tensor", {tensor.size()}, tensor.data());
    f.write("/piece_offset", {offset.size()}, offset.data());
    f.write("/piece_count", {count.size()}, count.data());
    const Snapshot* arrays[3] = {&weights_, &m_, &v_};
    for (int a = 0; a < 3; ++a) {
      const Snapshot& arr = *arrays[a];
      std::vector<uint64_t> sums;
      for (const Piece& p : pieces) sums.push_back(xxh3_64(arr.data() + (p.offset - begin), p.count * sizeof(float)));
      const std::string name = std::string("/") + kArrays[a];
      if (arr.empty()) {
        f.write(name, {0}, arr.data());  // HDF5 allocates no storage for an empty extent
      } else {
        regions.push_back({reinterpret_cast<const char*>(arr.data()), arr.size() * sizeof(float),
                           f.reserve<float>(name, {arr.size()})});
      }
      f.write(std::string("/checksum_") + kArrays[a], {sums.size()}, sums.data());
    }
    if (const int64_t ms = test_delay_ms(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    f.close();
  }
  // HDF5 is done with the file (it writes nothing into reserved storage), so the raw bytes
  // cannot be overwritten by a late metadata flush.
  io_ = write_regions(path, regions);
  fsync_path(path, false);
  // The arrays' bytes from the snapshot, the rest read back: no second read of the arrays.
  file_xxh3_ = ckpt::xxh3_file(path, regions);
  bytes_ = 3 * weights_.size() * sizeof(float);
}

double CheckpointWriter::wait_snapshot() {
  if (!copy_pending_) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(copy_mutex_);
  copy_done_.wait(lock, [this] { return copied_; });
  copy_pending_ = false;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CheckpointWriter::State CheckpointWriter::wait() {
  join();
  return state();
}

void CheckpointWriter::abandon() {
  join();
  state_ = kIdle;
  if (rank_ == 0 && pending_step_ >= 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir_ + "/." + step_name(pending_step_) + ".tmp", ec);
  }
  pending_step_ = -1;
}

// checkpoint.h5: the attributes, the tokenizer and one virtual dataset per tensor and array,
// stitched from the rank files' pieces.
void CheckpointWriter::write_master(const std::string& path, const std::vector<size_t>& shard_begin,
                                    const std::vector<size_t>& shard_end) {
  h5::File f = h5::File::create(path);
  write_master_attrs(f, info_, world_size_, shard_begin, shard_end);
  if (!tokenizer_.empty())
    f.write("/tokenizer/model", {tokenizer_.size()}, reinterpret_cast<const uint8_t*>(tokenizer_.data()));
  for (const char* arr : kArrays) {
    for (size_t t = 0; t < names_.size(); ++t) {
      h5::Dims dims(shapes_[t].begin(), shapes_[t].end());
      uint64_t numel = 1;
      for (int64_t d : shapes_[t]) numel *= uint64_t(d);
      std::vector<h5::File::VirtualPiece> vp;
      for (int r = 0; r < world_size_; ++r) {
        const uint64_t b = std::max<uint64_t>(shard_begin[size_t(r)], offsets_[t]);
        const uint64_t e = std::min<uint64_t>(shard_end[size_t(r)], offsets_[t] + numel);
        if (b >= e) continue;
        const uint64_t src_len = shard_end[size_t(r)] - shard_begin[size_t(r)];
        row_blocks(shapes_[t], b - offsets_[t], e - offsets_[t], [&](h5::Dims start, h5::Dims count, uint64_t done) {
          vp.push_back({rank_file_name(r), std::string("/") + arr, src_len, b - shard_begin[size_t(r)] + done, start,
                        count});
        });
      }
      f.write_virtual_float(std::string("/") + arr + "/" + names_[t], dims, vp);
    }
  }
  f.close();
}

// After D/step-N is in place: D/latest, D/best when it is the run's best, then the checkpoints
// beyond the newest keep_last except the one D/best names. The checkpoint is complete whatever
// happens here (a resume lists the step directories), so a failure is only a warning.
void CheckpointWriter::update_latest(const std::string& name) {
  std::vector<std::string> pointers = {"latest"};
  if (info_.best_eval_step >= 0 && info_.best_eval_step == info_.step) pointers.push_back("best");
  for (const std::string& pointer : pointers) {
    try {
      write_file_atomic(dir_ + "/" + pointer, name + "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train: warning: %s is complete, but %s/%s still names an older one: %s\n",
                   (dir_ + "/" + name).c_str(), dir_.c_str(), pointer.c_str(), e.what());
    }
  }
  if (keep_last_ <= 0) return;
  const std::vector<std::string> all = list_checkpoints(dir_);  // newest first: never the one just published
  const std::string best = std::filesystem::path(best_checkpoint(dir_)).filename().string();
  for (size_t i = size_t(keep_last_); i < all.size(); ++i) {
    std::error_code ec;
    if (std::filesystem::path(all[i]).filename() != best) std::filesystem::remove_all(all[i], ec);
  }
}

namespace {

// A checkpoint directory of this step from before (one a resume skipped as damaged, or a run that
// went back to an older step) would make the rename fail: it is renamed to NAME.replaced-<unix
// time>, kept for inspection (resume and keep_last ignore such names), never deleted.
void move_aside_if_present(const std::string& final_dir) {
  std::error_code ec;
  if (!std::filesystem::exists(final_dir, ec)) return;
  const std::string aside = strcat(final_dir, ".replaced-", static_cast<long long>(std::time(nullptr)));
  if (std::rename(final_dir.c_str(), aside.c_str()) != 0)
    fail(strcat(final_dir, ": exists from before and cannot be moved aside to ", aside, " (", std::strerror(errno), ")"));
  std::fprintf(stderr, "train: warning: %s existed from before; moved aside to %s\n", final_dir.c_str(), aside.c_str());
}

}  // namespace

void CheckpointWriter::publish(const std::vector<size_t>& shard_begin, const std::vector<size_t>& shard_end,
                               bool wait_for_it, std::vector<uint64_t> rank_sums) {
  join();
  state_ = kIdle;
  const int64_t step = pending_step_;
  pending_step_ = -1;
  if (rank_ != 0) return;
  if (rank_sums.empty()) rank_sums.push_back(file_xxh3_);
  LT_CHECK(int(rank_sums.size()) == world_size_, "publish: ", rank_sums.size(), " rank sums for ", world_size_,
           " ranks");
  auto run = [this, shard_begin, shard_end, rank_sums, step, wait_for_it] {
    if (!wait_for_it) lower_thread_priority();
    const std::string name = step_name(step);
    const std::string tmp_dir = dir_ + "/." + name + ".tmp";
    try {
      const std::string path = tmp_dir + "/checkpoint.h5";
      write_master(path, shard_begin, shard_end);
      std::vector<std::pair<std::string, uint64_t>> sums = {{"checkpoint.h5", ckpt::xxh3_file(path)}};
      for (int r = 0; r < world_size_; ++r) sums.emplace_back(rank_file_name(r), rank_sums[size_t(r)]);
      ckpt::write_manifest(tmp_dir, sums);
      fsync_path(path, false);
      fsync_path(tmp_dir, true);
      const std::string final_dir = dir_ + "/" + name;
      move_aside_if_present(final_dir);
      if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
        fail(strcat(final_dir, ": cannot rename ", tmp_dir, " onto it (", std::strerror(errno), ")"));
      fsync_path(dir_, true);
      published_step_ = step;
      publish_error_.clear();
    } catch (const std::exception& e) {
      publish_error_ = e.what();
      std::error_code ec;
      std::filesystem::remove_all(tmp_dir, ec);  // its room is what the next checkpoint needs
      std::fprintf(stderr, "train: warning: checkpoint of step %lld was not published: %s\n",
                   static_cast<long long>(step), publish_error_.substr(0, publish_error_.find('\n')).c_str());
      return;
    }
    update_latest(name);
  };
  if (wait_for_it) run();
  else worker_ = std::thread(run);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.compare(0, 5, "step-") != 0) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (!e.is_directory()) continue;
    found.emplace_back(std::atoll(name.c_str() + 5), e.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string best_checkpoint(const std::string& dir) {
  const std::string marker = dir + "/best";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(marker, ec) || file_size(marker) > 64) return "";
  std::string name = read_file_bytes(marker);
  if (!name.empty() && name.back() == '\n') name.pop_back();
  // Only a name list_checkpoints would list: the marker may not lead out of the directory.
  if (name.size() != 13 || name.compare(0, 5, "step-") != 0 || name.find_first_not_of("0123456789", 5) != std::string::npos)
    return "";
  return (std::filesystem::path(dir) / name).string();
}

namespace {

// Format 1 kept the training options as one JSON string (train_config); what resume uses of it.
TrainingRecord training_from_json(const std::string& train_config) {
  TrainingRecord r;
  check_json_depth(train_config, "the checkpoint's train_config");
  const nlohmann::json j = nlohmann::json::parse(train_config, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return r;
  r.data_path = j.value("data", std::string());
  r.batch_size = j.value("batch_size", int64_t(0));
  r.global_batch = j.value("global_batch", int64_t(0));
  r.lr = j.value("lr", 0.0f);
  r.min_lr = j.value("min_lr", 0.0f);
  r.warmup_steps = j.value("warmup_steps", int64_t(0));
  r.total_steps = j.value("total_steps", int64_t(0));
  return r;
}

}  // namespace

namespace {

// checkpoint.h5, opened once its bytes match checksums.xxh3 (which format 3 must have), and its
// format_version.
h5::File open_master(const std::string& path, int64_t* version) {
  const std::string file = path + "/checkpoint.h5";
  if (!file_exists(file)) fail(strcat(path, ": not a checkpoint (no checkpoint.h5)"));
  const bool listed = ckpt::has_manifest(path);
  if (listed) ckpt::verify_file(path, ckpt::read_manifest(path), "checkpoint.h5");
  h5::File f = h5::File::open_read(file);
  if (!f.has_attr("/", "format") || f.read_attr_string("/", "format") != kFormat)
    fail(strcat(file, ": not a llamatrain checkpoint (attribute format)"));
  *version = f.read_attr_int("/", "format_version");
  if (*version < kOldestFormatVersion || *version > kFormatVersion)
    fail(strcat(file, ": format_version ", *version, ", this build reads ", kOldestFormatVersion, " to ",
                kFormatVersion));
  if (*version >= 3 && !listed)
    fail(strcat(path, "/", ckpt::kManifest, ": missing, so checkpoint.h5 cannot be checked (damaged checkpoint)"));
  return f;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  int64_t version = 0;
  const h5::File f = open_master(path, &version);
  const std::string& file = f.path();
  CheckpointInfo ci;
  ci.path = path;
  ci.step = f.read_attr_int("/", "step");
  ci.epoch = f.read_attr_int("/", "epoch");
  ci.world_size = int(f.read_attr_int("/", "world_size"));
  ci.zero_stage = int(f.read_attr_int("/", "zero_stage"));
  ci.seed = uint64_t(f.read_attr_int("/", "seed"));
  ci.global_batch = f.read_attr_int("/", "global_batch");
  ci.tokenizer_sha256 = f.read_attr_string("/", "tokenizer_sha256");
  ci.data_identity = f.read_attr_string("/", "data_identity");
  if (version >= 2) {
    for (int64_t k : f.read_attr_ints("/", "split")) ci.split.push_back(int(k));
    ci.model_config = read_model_config_attrs(f, "/").to_string();
    ci.training = read_training_record(f, "/training");
  } else {
    ci.split = split_ints(f.read_attr_string("/", "split"));
    ci.model_config = f.read_attr_string("/", "model_config");
    ci.training = training_from_json(f.read_attr_string("/", "train_config"));
  }
  if (f.has_attr("/", "lora")) ci.lora = f.read_attr_string("/", "lora");
  if (f.has_attr("/", "best_eval_step")) {
    ci.best_eval_step = f.read_attr_int("/", "best_eval_step");
    ci.best_eval_loss = f.read_attr_double("/", "best_eval_loss");
  }
  if (ci.world_size < 1 || ci.step < 0) fail(strcat(file, ": bad world_size or step"));
  // A published checkpoint's directory is named after its step (step_name): a step attribute
  // that says otherwise was changed after the fact, and a resume would skip or repeat steps.
  const std::string dir_name = std::filesystem::path(path).filename().string();
  if (dir_name.compare(0, 5, "step-") == 0 && dir_name != step_name(ci.step))
    fail(strcat(file, ": step attribute ", ci.step, " disagrees with the directory name ", dir_name,
                " (damaged or tampered checkpoint)"));
  return ci;
}

namespace {

// One rank file of a checkpoint and the flat range [begin, end) it holds.
struct RankFile {
  std::string name;
  uint64_t begin = 0, end = 0;
};

// checkpoint.h5's rank files: the lists rank_files, rank_begin, rank_end, or (format 1) one
// string of "name begin end" lines. Each range lies within the n parameters.
std::vector<RankFile> read_rank_files(const h5::File& f, size_t n) {
  std::vector<RankFile> out;
  if (f.has_attr("/", "rank_begin")) {
    const auto names = f.read_attr_strings("/", "rank_files");
    const auto begin = f.read_attr_ints("/", "rank_begin"), end = f.read_attr_ints("/", "rank_end");
    if (begin.size() != names.size() || end.size() != names.size())
      fail(strcat(f.path(), ": rank_files, rank_begin and rank_end differ in length"));
    for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], uint64_t(begin[i]), uint64_t(end[i])});
  } else {
    const std::string text = f.read_attr_string("/", "rank_files");
    for (size_t start = 0; start < text.size();) {
      size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      const std::string line = text.substr(start, nl - start);
      char name[64] = {0};
      unsigned long long b = 0, e = 0;
      if (std::sscanf(line.c_str(), "%63s %llu %llu", name, &b, &e) != 3)
        fail(strcat(f.path(), ": bad rank_files entry '", line, "'"));
      out.push_back({name, b, e});
      start = nl + 1;
    }
  }
  for (const RankFile& r : out)
    if (r.begin > r.end || r.end > n)
      fail(strcat(f.path(), ": rank file ", r.name, " holds [", r.begin, ", ", r.end, "), outside the model's ", n,
                  " parameters"));
  return out;
}

}  // namespace

namespace {

using PieceSum = uint64_t (*)(const void*, size_t);

// The piece table of a rank file holding [b, e) must be the model's own cut of that range.
std::vector<Piece> check_piece_table(const h5::File& rf, const TensorTable& layout, uint64_t b, uint64_t e) {
  const auto tensor = rf.read<int64_t>("/piece_tensor");
  const auto offset = rf.read<uint64_t>("/piece_offset");
  const auto count = rf.read<uint64_t>("/piece_count");
  const std::vector<Piece> expect = pieces_of(layout, b, e);
  if (tensor.size() != expect.size() || offset.size() != expect.size() || count.size() != expect.size())
    fail(strcat(rf.path(), ": its piece table does not match the model (another model shape?)"));
  for (size_t i = 0; i < expect.size(); ++i)
    if (tensor[i] != expect[i].tensor || offset[i] != expect[i].offset || count[i] != expect[i].count)
      fail(strcat(rf.path(), ": piece ", i, " does not match the model's tensor ",
                  layout.tensors()[size_t(expect[i].tensor)].name));
  return expect;
}

// Reads array a (0 weights, 1 adam_m, 2 adam_v) of a rank file that starts at flat offset b, the
// pieces a rank needs: the weights whole into dst + x when whole, else as the moments, over
// [begin, end) into dst + (x - begin); each piece read is checked against its sum.
void load_rank_array(const h5::File& rf, int a, const std::vector<Piece>& pieces, uint64_t b, PieceSum sum,
                     const TensorTable& layout, float* dst, size_t begin, size_t end, bool whole) {
  const auto sums = rf.read<uint64_t>(std::string("/checksum_") + kArrays[a]);
  if (sums.size() != pieces.size()) fail(strcat(rf.path(), ": checksum_", kArrays[a], " has the wrong length"));
  std::vector<float> buf;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const uint64_t need_b = whole ? p.offset : std::max<uint64_t>(p.offset, begin);
    const uint64_t need_e = whole ? p.offset + p.count : std::min<uint64_t>(p.offset + p.count, end);
    if (need_b >= need_e) continue;
    buf.resize(p.count);
    rf.read_rows<float>(std::string("/") + kArrays[a], p.offset - b, p.count, buf.data());
    if (sum(buf.data(), p.count * sizeof(float)) != sums[i])
      fail(strcat(rf.path(), ": checksum mismatch in ", kArrays[a], " of ", layout.tensors()[size_t(p.tensor)].name,
                  " [", p.offset, ", ", p.offset + p.count, ") (damaged checkpoint)"));
    float* out = whole ? dst + need_b : dst + (need_b - begin);
    std::memcpy(out, buf.data() + (need_b - p.offset), (need_e - need_b) * sizeof(float));
  }
}

}  // namespace

void load_checkpoint_state(const std::string& path, const TensorTable& layout, float* params, size_t begin,
                           size_t end, float* m, float* v, bool params_whole) {
  int64_t version = 0;
  const h5::File mf = open_master(path, &version);
  // Format 3 sums pieces with XXH3 and repeats the run's stamp in every rank file.
  const PieceSum sum = version >= 3 ? xxh3_64 : checksum64;
  const auto stamp = version >= 3 ? read_run_stamp(mf) : std::vector<std::pair<std::string, std::string>>{};
  const int64_t step = mf.read_attr_int("/", "step");
  const size_t n = layout.total();
  size_t covered = 0;
  for (const RankFile& rank : read_rank_files(mf, n)) {
    const uint64_t b = rank.begin, e = rank.end;
    if (b != covered) fail(strcat(mf.path(), ": rank files do not tile the parameters (gap at ", covered, ")"));
    covered = e;
    const h5::File rf = h5::File::open_read(path + "/" + rank.name);
    if (uint64_t(rf.read_attr_int("/", "begin")) != b || uint64_t(rf.read_attr_int("/", "end")) != e)
      fail(strcat(rf.path(), ": its range disagrees with checkpoint.h5"));
    // A rank file of another checkpoint passes its own checksums; its step (format 3: its whole
    // run stamp) says where it is from.
    if (version >= 3) {
      check_run_stamp(rf, stamp);
    } else if (const int64_t own = rf.read_attr_int("/", "step"); own != step) {
      fail(strcat(rf.path(), ": written at step ", own, ", but checkpoint.h5 is step ", step,
                  " (a rank file from another checkpoint: damaged)"));
    }
    const std::vector<Piece> pieces = check_piece_table(rf, layout, b, e);
    float* dests[3] = {params, m, v};
    for (int a = 0; a < 3; ++a)
      load_rank_array(rf, a, pieces, b, sum, layout, dests[a], begin, end, a == 0 && params_whole);
  }
  if (covered != n) fail(strcat(mf.path(), ": rank files cover ", covered, " of ", n, " parameters"));
}

}  // namespace lt
