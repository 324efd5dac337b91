// The training loop: epochs of optimizer steps, each of grad_accum micro-batches, with a
// warm-up + cosine LR schedule, global-norm clipping, AdamW, per-step metrics and a test-split
// evaluation at every epoch end (and every --eval-every steps). Its parts: src/train/train_parts.h.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llamatrain/balance.h"
#include "llamatrain/comm.h"
#include "llamatrain/comm_wait.h"
#include "llamatrain/config.h"
#include "llamatrain/dataset.h"
#include "llamatrain/engine.h"
#include "llamatrain/model.h"
#include "llamatrain/lora.h"
#include "llamatrain/optim.h"

namespace lt {

// Overrides of a preset's dimensions; a value <= 0 keeps the preset's.
struct ModelOverrides {
  int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0,
      max_seq_len = 0;
  void apply(Llama2Config& cfg) const;
};

struct TrainOptions {
  std::string model_config = "tiny";  // preset, used when init_from is empty
  ModelOverrides overrides;
  std::string init_from;              // model file (HDF5 or llama2.c .bin) to fine-tune
  std::string tokenizer;              // --tokenizer: init_from's tokenizer when its format stores none
  bool allow_tokenizer_mismatch = false;  // fine-tune on data whose tokenizer differs or is unknown
  std::string data;                   // DATA.h5
  int batch_size = 8;                 // sequences per micro-batch (the same shape on every rank)
  int grad_accum = 1;                 // micro-batches per rank per step, when global_batch is 0
  int64_t global_batch = 0;           // sequences per optimizer step; 0: batch_size * grad_accum * ranks
  DeviceChoice device = DeviceChoice::kAuto;  // --device auto | cpu | cuda | cuda-sim (device.h)
  Attention attention = Attention::kNative;  // cuDNN's fused attention: --device cuda only
  double comm_timeout = kDefaultCommTimeoutS;  // seconds a device collective may take (comm_wait.h)
  int bucket_mb = int(kDefaultBucketMiB);  // ZeRO 0/1 gradient buckets, MiB of fp32; 0: one per block (zero_plan.h)
  std::string trace_collectives;      // --trace-collectives FILE: rank r traces its ZeRO collectives to FILE.r
  int zero3_prefetch = 1;             // device ZeRO 3: blocks gathered ahead of use (0 or 1)
  bool offload_optimizer = false;     // device ZeRO 1-3: fp32 master and Adam on the host (device.h)
  int zero_stage = 1;                 // 0, 1, 2 or 3 (zero.h)
  DType grad_reduce_dtype = DType::kF32;  // kF32 | kBF16: gradients on the wire and in ZeRO 2/3 shards (grad_shard.h)
  Recompute recompute = Recompute::kNone;  // activation recomputation (src/model/llama2_pass.h)
  Precision precision = Precision::kFp32;  // the CPU's products (config.h); a CUDA device's are bf16
  bool precision_given = false;            // --precision was given (a device refuses fp32 then)
  BalanceMode balance = BalanceMode::kOff;
  std::string rank_weights;           // static (and auto's starting) weights "w0,w1,..."
  int rebalance_every = 10;           // auto: steps between rebalancing decisions
  std::string simulate_slowdown;      // "RANK=FACTOR": that rank's compute FACTOR times slower
  int epochs = 1;
  int64_t max_steps = 0;              // > 0: stop after this many steps (overrides epochs)
  float lr = 3e-4f, min_lr = 3e-5f;
  int64_t warmup_steps = 0;
  int64_t eval_every = 0;             // > 0: also the test-split loss every N steps
  int64_t eval_batches = 0;           // > 0: each test loss over the split's first N micro-batches only
  AdamWConfig adamw;
  LoraConfig lora;                    // rank > 0: LoRA adapters on the frozen model (lora.h)
  float grad_clip = 1.0f;             // <= 0 disables clipping
  uint64_t seed = 1234;
  std::string output;                 // DIR: final model DIR/model.h5
  bool save_init = false;             // also DIR/init.h5: the model before the first step
  std::string metrics;                // FILE.jsonl
  std::string checkpoint_dir;         // DIR: checkpoints (checkpoint.h), at every epoch end at least
  bool checkpoint_on_stop_only = false;  // checkpoint_dir is --output's default (DIR/checkpoints): written
                                        // only on a stop signal, removed when the run completes
  int64_t checkpoint_every = 0;       // > 0: also every N steps
  int keep_last = 3;                  // checkpoints kept (older ones are deleted); 0 keeps all
  bool keep_best = false;             // also keep the checkpoint (checkpoint_dir/best) and the weights
                                      // (output/best.h5) of the lowest --eval-every test loss
  std::string resume = "auto";        // auto (newest valid in checkpoint_dir) | none | PATH
  bool allow_new_data = false;        // resume on a dataset other than the checkpoint's
  bool shuffle = true;
  bool progress = true;
  bool quiet = false;                 // no summary lines on stderr
  std::string command_line;           // how train was invoked, for the record in model.h5 and checkpoints
};

struct TrainResult {
  int64_t steps = 0;
  std::vector<int> split;                // micro-batches per rank at the end
  double last_loss = 0;                  // mean loss per token of the last step (the model's record)
  // Mean loss per token over the first and the last window_steps steps of this process's run (10,
  // or half its steps when it ran fewer than 20), what the final summary line compares.
  double first_window_loss = 0, last_window_loss = 0;
  int window_steps = 0;
  double test_loss = -1;                 // after the last epoch (-1 when no test split)
  double seconds = 0;
  std::string model_path;
  int64_t start_step = 0;                // > 0 when resumed from a checkpoint
  std::string resumed_from;
  bool stopped_by_signal = false;        // SIGTERM/SIGUSR1: checkpoint written, run stopped early
  bool already_complete = false;         // resumed at the run's last step: nothing trained or written
  // The final state (the last step's checkpoint with --checkpoint-dir, the model with --output)
  // could not be saved; on rank 0, state_report says so and where the newest saved state is.
  bool state_not_saved = false;
  std::string state_report;
  int64_t metrics_lost = 0;              // metrics records that could not be written (rank 0)
};

// Exit status of `train` when a signal stopped it after writing a checkpoint (resume with
// --resume auto).
constexpr int kExitStoppedBySignal = 3;
// Exit status of `train` when it trained but could not save its final state (or, stopped by a
// signal, the checkpoint of that step): work since the newest saved state is lost.
constexpr int kExitStateNotSaved = 4;
// (5, a failed or hung collective on device buffers, is kExitCommFault in comm_wait.h.)

TrainResult run_training(const TrainOptions& opt);

// Refuses data that does not fit a model: a vocabulary larger than the model's, rows longer than
// its max_seq_len, or (when the model file carries its tokenizer) another tokenizer.
// How check_data_fits_model treats the tokenizer: kNone for a freshly initialised model (it
// learns the data's); kStrict for a pretrained one: the model's tokenizer (stored in the model
// file, else given by --tokenizer) must be the one the data was prepared with; kWarn
// (--allow-tokenizer-mismatch) says so on stderr instead of refusing.
enum class TokenizerCheck { kNone, kStrict, kWarn };
void check_data_fits_model(const Dataset& ds, const Llama2Config& cfg, const std::string& model_tokenizer,
                           const std::string& model_origin, TokenizerCheck check = TokenizerCheck::kStrict);

// Sum of the masked next-token losses over a whole split (micro-batches of batch_size rows);
// *loss_tokens receives the count of tokens with loss. With a communicator of several ranks, the
// micro-batches are dealt out round-robin and the sums are all-reduced (every rank must call).
// `on_batch`, when given, hears the sequences done so far before each micro-batch (progress).
double evaluate_split(Evaluator& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                      const std::function<void(int64_t sequences_done)>& on_batch = {});
class Comm;
double evaluate_split(Evaluator& model, const TokenSplit& split, int batch_size, int64_t* loss_tokens,
                      Comm& comm);

}  // namespace lt
