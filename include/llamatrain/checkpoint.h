// Training checkpoints (DESIGN.md "Formats"): sharded, written in the background, published
// atomically, checksummed, and loadable on any number of ranks.
//
// A checkpoint is a directory D/step-<8 digits>/ holding
//   rank-<5 digits>.h5   one per rank, written by that rank alone: its contiguous shard
//                        [begin, end) of the flat fp32 master weights, Adam m and v (1-D
//                        datasets /weights, /adam_m, /adam_v), per piece (a tensor cut by the
//                        shard) its tensor, offset, length and the XXH3-64 of each of the three
//                        arrays, and the run's stamp (step, epoch, seed, world size, ZeRO stage,
//                        global batch, split, data identity), which a load compares with
//                        checkpoint.h5's;
//   checkpoint.h5        written by rank 0 once every rank's file is complete: the step, epoch,
//                        seed, batch split, world size, ZeRO stage, the model configuration (the
//                        attributes of model.h5), tokenizer and dataset identity, the rank files
//                        and their ranges as attributes, the /training group (h5_attrs.h), the
//                        tokenizer, and /weights/<name>, /adam_m/<name>, /adam_v/<name>: one HDF5
//                        virtual dataset per named tensor, with its shape, mapped onto the rank
//                        files, so h5py and h5dump read any tensor by name without knowing the
//                        rank count;
//   checksums.xxh3       the XXH3-64 of every file above, as `xxhsum -H3` prints it, so that
//                        `xxhsum -c checksums.xxh3` checks the checkpoint (ckpt/checkpoint_sums.h);
//                        a load checks checkpoint.h5 against it before trusting any attribute.
// Publication: everything is written into D/.step-<n>.tmp/, fsynced, the directory renamed to
// D/step-<n>, D fsynced, then D/latest (the directory name) replaced atomically, and D/best too
// when the checkpoint is the run's best (train --keep-best: its best_eval_step is its own step);
// pruning to the newest keep_last never removes the checkpoint D/best names. A crash at any
// instant leaves the newest complete checkpoint usable; a damaged one (checksum, HDF5 error,
// missing file, a rank file whose stamp disagrees with checkpoint.h5) is reported and the
// previous one is used. Formats 1 and 2 (no manifest, no stamp in the rank files, checksum64
// piece sums) still load, their piece sums checked as before.
//
// Writing a rank file: HDF5 writes the attributes and small tables and reserves the three arrays'
// storage at 4096-byte aligned offsets; after HDF5 closed the file, the arrays' bytes are written
// there from the (equally aligned) snapshot with O_DIRECT, so the kernel does not copy them into
// the page cache first, then the file is fsynced before anything is published. Where O_DIRECT is
// refused (EINVAL: a file system without it), or the environment sets
// LLAMATRAIN_CHECKPOINT_BUFFERED=1, the same bytes go through ordinary buffered writes; the files
// are identical either way. last_io() says which path a write took.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "llamatrain/comm.h"
#include "llamatrain/config.h"
#include "llamatrain/h5_attrs.h"
#include "llamatrain/model.h"

namespace lt {

// Allocates on 4096-byte boundaries: O_DIRECT writes need the memory they read from aligned to
// the device's logical block size (512 or 4096 bytes).
template <class T>
struct BlockAlignedAllocator {
  using value_type = T;
  static constexpr size_t kAlignment = 4096;
  BlockAlignedAllocator() = default;
  template <class U>
  BlockAlignedAllocator(const BlockAlignedAllocator<U>&) {}  // NOLINT: rebinding must be implicit
  T* allocate(size_t n) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    const size_t bytes = (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes ? bytes : kAlignment);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const BlockAlignedAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const BlockAlignedAllocator<U>&) const { return false; }
};

// XXH3-64 with seed 0 (libxxhash): the checksum of checkpoints of format 3, as `xxhsum -H3`
// computes it.
uint64_t xxh3_64(const void* data, size_t n);
// The piece checksum of formats 1 and 2, kept to check them: our own 64-bit hash (not a standard
// one; 4 independent multiply-rotate lanes over 8-byte words, folded with the length).
uint64_t checksum64(const void* data, size_t n);

// What identifies a run for resuming: the model shape, tokenizer and data, and the data cursor.
struct CheckpointInfo {
  int64_t step = 0;             // optimizer steps done
  int64_t epoch = 0;            // epoch of the next step
  int world_size = 1;
  int zero_stage = 1;
  uint64_t seed = 0;
  int64_t global_batch = 0;
  std::vector<int> split;       // micro-batches per rank at the time of the checkpoint
  std::string model_config;      // Llama2Config::to_string()
  std::string tokenizer_sha256;  // of the serialized tokenizer (empty: none)
  std::string data_identity;     // the dataset's identity (dataset_identity())
  // A LoRA run's (train --lora-rank): the adapters' configuration and the frozen base's identity;
  // its weights, Adam m and v are then the adapters' (LoraLayout::table). "" for a model's.
  std::string lora;
  TrainingRecord training;       // how the run trains: checkpoint.h5's /training group
  // train --keep-best: the lowest --eval-every test loss of the run so far and the step count it
  // was measured at (-1: none, and neither is written), so that a resumed run goes on comparing.
  int64_t best_eval_step = -1;
  double best_eval_loss = 0;
  std::string path;              // the checkpoint directory (when read)
};

// The state a rank hands to a checkpoint: the full working weights (every rank has them) and the
// Adam moments of the flat range [begin, end) it owns.
struct ShardView {
  const float* params = nullptr;  // the weights of [begin, end): params[0] is flat offset begin
  const float* m = nullptr;       // (end - begin)
  const float* v = nullptr;
  size_t begin = 0, end = 0;
};

// One per rank. start() hands the state to a background thread, which copies it to host memory
// (the snapshot) and then writes this rank's file; the training thread may read its buffers
// meanwhile but must call wait_snapshot() before it changes them (the optimizer update). The
// trainer learns every rank's progress through its per-step allgather and calls publish() on all
// ranks once all are done.
class CheckpointWriter {
 public:
  enum State { kIdle = 0, kWriting = 1, kWritten = 2, kFailed = 3 };
  // A tensor cut by a shard: elements [offset, offset + count) of the flat buffer, inside tensor t.
  struct Piece {
    int64_t tensor = 0;
    uint64_t offset = 0, count = 0;
  };
  CheckpointWriter(std::string dir, int rank, int world_size, int keep_last);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Snapshot of this rank's state, then the write, both in the background. Waits first for a write
  // or publication still in flight on this rank. Returns the seconds spent on this thread.
  double start(const CheckpointInfo& info, const TensorTable& layout, const ShardView& view,
               const std::string& tokenizer_model);
  // Blocks until the snapshot of the last start() has been copied, after which the buffers of its
  // ShardView may change; returns the seconds waited (0 when there is nothing to wait for).
  double wait_snapshot();
  State state() const { return State(state_.load()); }
  int64_t pending_step() const { return pending_step_; }
  const std::string& error() const { return error_; }  // after kFailed
  // Once every rank reported kWritten: rank 0 writes checkpoint.h5 and checksums.xxh3 and
  // publishes (in the background unless `wait`); every rank returns to kIdle. rank_sums: every
  // rank's last_file_xxh3() (may be empty with one rank).
  void publish(const std::vector<size_t>& shard_begin, const std::vector<size_t>& shard_end, bool wait,
               std::vector<uint64_t> rank_sums = {});
  // After some rank failed: drop the partial checkpoint; every rank returns to kIdle.
  void abandon();
  // Waits for this rank's background work; returns its state.
  State wait();
  double last_write_seconds() const { return write_seconds_; }
  double last_copy_seconds() const { return copy_seconds_; }  // the snapshot, on the background thread
  uint64_t last_bytes() const { return bytes_; }
  // How the last write put the arrays on disk: "direct" (O_DIRECT) or "buffered (<why>)".
  const std::string& last_io() const { return io_; }
  // XXH3-64 of this rank's whole file, after kWritten.
  uint64_t last_file_xxh3() const { return file_xxh3_; }
  // Rank 0, once its publication finished (wait()): the step of the newest checkpoint this writer
  // published (-1: none), and why the last publication failed ("" when it did not).
  int64_t published_step() const { return published_step_; }
  const std::string& publish_error() const { return publish_error_; }
  const std::string& dir() const { return dir_; }

 private:
  void join();
  void write_shard(const std::vector<Piece>& pieces, size_t begin, size_t end);
  void write_master(const std::string& path, const std::vector<size_t>& shard_begin,
                    const std::vector<size_t>& shard_end);
  void update_latest(const std::string& name);
  std::string dir_;
  int rank_, world_size_, keep_last_;
  std::thread worker_;
  std::atomic<int> state_{kIdle};
  int64_t pending_step_ = -1;
  std::string error_;
  double write_seconds_ = 0;
  uint64_t bytes_ = 0;
  std::string io_;
  uint64_t file_xxh3_ = 0;
  int64_t published_step_ = -1;
  std::string publish_error_;
  // The snapshot copy's completion, for wait_snapshot(); copy_pending_ is the training thread's.
  std::mutex copy_mutex_;
  std::condition_variable copy_done_;
  bool copied_ = true;
  bool copy_pending_ = false;
  double copy_seconds_ = 0;
  // The snapshot (kept until published, for checkpoint.h5's mapping).
  CheckpointInfo info_;
  std::vector<float, BlockAlignedAllocator<float>> weights_, m_, v_;
  std::string tokenizer_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<size_t> offsets_;
};

// Checkpoint directories in `dir`, newest first (complete ones only: D/step-<n>).
std::vector<std::string> list_checkpoints(const std::string& dir);
// The checkpoint directory D/best names (D/step-<n>), or "" when there is no such marker.
std::string best_checkpoint(const std::string& dir);
// Reads and validates checkpoint.h5's attributes (throws lt::Error on damage).
CheckpointInfo read_checkpoint_info(const std::string& path);
// Loads a checkpoint into this rank's state: the full weights into params (n_params; with
// params_whole false, ZeRO stage 3, only those of [begin, end), params[0] at flat offset begin)
// and the Adam moments of [begin, end) into m, v; every piece read is checked against its
// checksum. Reads only the pieces that overlap what this rank needs.
void load_checkpoint_state(const std::string& path, const TensorTable& layout, float* params, size_t begin,
                           size_t end, float* m, float* v, bool params_whole = true);
// The identity of a dataset for refusing to resume on other data: source sha256, seq_len, rows.
std::string dataset_identity(const struct Dataset& ds);

}  // namespace lt
