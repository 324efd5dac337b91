#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/ranges.h"
#include "llamatrain/comm.h"
#include "llamatrain/config.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/runtime.h"

namespace lt::cli {

namespace {

// The model: a preset or --init-from with its tokenizer, the preset's overrides, and the data.
void add_model_options(CLI::App* sub, TrainOptions& o) {
  std::string presets;
  for (const auto& n : preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  auto* preset = sub->add_option("--model-config", o.model_config, "Model preset: " + presets)->capture_default_str();
  auto* init = sub->add_option("--init-from", o.init_from,
                               "Start from this model (HDF5, llama2.c .bin, HF directory or a checkpoint) instead of "
                               "a preset")
                   ->excludes(preset);
  sub->add_option("--tokenizer", o.tokenizer,
                  "With --init-from a model that stores no tokenizer (llama2.c .bin): its tokenizer .model, which "
                  "must be the one --data was prepared with")
      ->needs(init);
  sub->add_flag("--allow-tokenizer-mismatch", o.allow_tokenizer_mismatch,
                "Fine-tune even though --data was prepared with another tokenizer than the --init-from model's "
                "(or the model's is unknown): a warning instead of the refusal")
      ->needs(init);
  in_range(sub->add_option("--dim", o.overrides.dim, "Override the preset's model width"), ints_from(1));
  in_range(sub->add_option("--hidden-dim", o.overrides.hidden_dim, "Override the FFN width"), ints_from(1));
  // At most 4096, as every model reader (config.json, llama2.c headers).
  in_range(sub->add_option("--n-layers", o.overrides.n_layers, "Override the number of layers"), ints_between(1, 4096));
  in_range(sub->add_option("--n-heads", o.overrides.n_heads, "Override the number of attention heads"), ints_from(1));
  in_range(sub->add_option("--n-kv-heads", o.overrides.n_kv_heads, "Override the number of KV heads (GQA)"),
           ints_from(1));
  in_range(sub->add_option("--vocab-size", o.overrides.vocab_size, "Override the vocabulary size"), ints_from(1));
  in_range(sub->add_option("--max-seq-len", o.overrides.max_seq_len, "Override the maximum sequence length"),
           ints_from(1));
  sub->add_option("--data", o.data, "Dataset made by `llamatrain prepare`")->required();
}

// The batches: sequences per micro-batch, micro-batches per step, or the global batch.
void add_batch_options(CLI::App* sub, TrainOptions& o) {
  in_range(sub->add_option("--batch-size", o.batch_size, "Sequences per micro-batch")->capture_default_str(),
           ints_from(1));
  auto* accum = in_range(sub->add_option("--grad-accum", o.grad_accum,
                                         "Micro-batches per rank per optimizer step (when --global-batch is not given)")
                             ->capture_default_str(),
                         ints_from(1));
  in_range(sub->add_option("--global-batch", o.global_batch,
                           "Sequences per optimizer step over all ranks (a multiple of --batch-size); "
                           "default --batch-size x --grad-accum x ranks")
               ->excludes(accum),
           ints_from<int64_t>(1));
}

// Where and how the steps run: the device and its kernels, the collectives and ZeRO, the precision,
// the recomputation and the balance of micro-batches over ranks.
void add_parallel_options(CLI::App* sub, TrainOptions& o) {
  add_device_choice(sub, o.device,
                    "Where forward/backward run: auto (a GPU when one is visible, else the CPU), cpu, cuda, or "
                    "cuda-sim (the CUDA backend with its kernels in the CPU simulator; slow, for tests)");
  add_choice(sub, "--attention", o.attention, {{"native", Attention::kNative}, {"cudnn", Attention::kCudnn}},
             "Attention kernel: native (ours) or cudnn (cuDNN's fused attention; GPU only, one example per "
             "sequence row, needs cuDNN 9)");
  add_real(sub, "--comm-timeout", o.comm_timeout,
           "Seconds a collective on device buffers (NCCL; cuda-sim's device communicator) may take before the rank "
           "aborts it and ends the job with exit status 5, naming the rank and the collective",
           reals_in(1, 86400, "[]"))
      ->capture_default_str();
  in_range(sub->add_option("--bucket-mb", o.bucket_mb,
                           "MiB of fp32 gradients ZeRO 0 and 1 reduce in one collective: consecutive layers are "
                           "grouped from the output head down until a bucket holds this much (a device reduces each "
                           "bucket as soon as the last micro-batch's backward has finished it); 0: one per layer "
                           "(stages 2 and 3 reduce each layer's block)")
               ->capture_default_str(),
           ints_between(0, 65536));
  sub->add_option("--trace-collectives", o.trace_collectives,
                  "Rank r writes the ZeRO collectives it issues to FILE.r, one line each (\"reduce-scatter 0 4096\": "
                  "the flat range), under a line \"# step N rounds R\" per step: what the ZeRO plan lists "
                  "(docs/architecture.md), for checking a run or finding where ranks part ways")
      ->type_name("FILE");
  in_range(sub->add_option("--zero3-prefetch", o.zero3_prefetch,
                           "Device ZeRO 3: blocks whose all-gather is issued while the block before them computes "
                           "(1, the default, overlaps the gathers with compute and holds one more block's bf16 "
                           "weights; 0 gathers each block when it is needed)")
               ->capture_default_str(),
           ints_between(0, 1));
  sub->add_flag("--offload-optimizer", o.offload_optimizer,
                "Device ZeRO 1-3: keep the fp32 master weights and Adam m, v in host memory and run the AdamW "
                "update there (DeepSpeed's offload_optimizer: cpu): 12 bytes per parameter of the rank's shard "
                "leave the device, at the cost of copying the gradient shard down and the bf16 weights up every step");
  in_range(
      sub->add_option("--zero", o.zero_stage,
                      "ZeRO stage: 0 replicates the optimizer, 1 shards the master weights and Adam state, 2 also "
                      "the gradients (reduced block by block into each rank's shard), 3 also the weights (each "
                      "block gathered before use and released after)")
          ->capture_default_str(),
      ints_between(0, 3));
  add_choice(sub, "--grad-reduce-dtype", o.grad_reduce_dtype, {{"fp32", DType::kF32}, {"bf16", DType::kBF16}},
             "Gradients on the wire: fp32, or bf16 (half the bytes; each rank's gradient rounded to nearest "
             "before the sum). With --zero 2 or 3 the rank's gradient shard is then bf16 too (half its "
             "memory; each micro-batch's sum rounded stochastically into it). On a device (ZeRO 0-2) each "
             "bucket crosses the wire in bf16 once per step and the gradients stay fp32");
  add_choice(sub, "--recompute", o.recompute,
             {{"none", Recompute::kNone}, {"attn", Recompute::kAttn}, {"full", Recompute::kFull}},
             "Activation recomputation: none keeps every layer's activations; attn recomputes each layer's "
             "q, k, v and attention in backward; full keeps only each layer's input and recomputes the layer "
             "(less memory, more compute; the same gradients)");
  add_precision_choice(sub, o.precision,
                       "Matrix-product operands on the CPU: fp32 (default, the reference) or bf16 (bf16 weights and "
                       "activations into oneDNN products with fp32 accumulation; fast only on CPUs with AMX). The CUDA "
                       "backend always computes in bf16")
      ->each([&o](const std::string&) { o.precision_given = true; });
  add_choice(sub, "--balance", o.balance,
             {{"off", BalanceMode::kOff}, {"static", BalanceMode::kStatic}, {"auto", BalanceMode::kAuto}},
             "Split of each step's micro-batches over ranks: off (even), static (--rank-weights), "
             "auto (measured compute time per micro-batch)");
  sub->add_option("--rank-weights", o.rank_weights, "Relative speed of each rank, w0,w1,... (static; auto starts from it)");
  in_range(sub->add_option("--rebalance-every", o.rebalance_every, "auto: steps between rebalancing decisions")
               ->capture_default_str(),
           ints_from(1));
  sub->add_option("--simulate-slowdown", o.simulate_slowdown,
                  "RANK=FACTOR: make that rank's compute FACTOR times slower (a simulation, for testing balancing)");
}

// The schedule and the optimizer: epochs or steps, the learning rate, evaluation, AdamW, LoRA and
// the seed.
void add_schedule_options(CLI::App* sub, TrainCliOptions& opt) {
  TrainOptions& o = opt.train;
  auto* epochs = in_range(
      sub->add_option("--epochs", o.epochs, "Passes over the training split")->capture_default_str(), ints_from(1));
  in_range(sub->add_option("--max-steps", o.max_steps, "Stop after this many optimizer steps (instead of --epochs)")
               ->excludes(epochs),
           ints_from<int64_t>(1));
  add_real(sub, "--lr", o.lr, "Peak learning rate", reals_above(0))->capture_default_str();
  opt.min_lr =
      add_real(sub, "--min-lr", o.min_lr, "Learning rate at the end of the cosine decay", reals_from(0))
          ->capture_default_str();
  in_range(sub->add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps")->capture_default_str(),
           ints_from<int64_t>(0));
  in_range(sub->add_option("--eval-every", o.eval_every,
                           "Also evaluate the test split every N optimizer steps (0: at epoch ends only)")
               ->capture_default_str(),
           ints_from<int64_t>(0));
  in_range(sub->add_option("--eval-batches", o.eval_batches,
                           "Evaluate only the test split's first N micro-batches (of --batch-size sequences) each "
                           "time (0: the whole split), like Megatron-LM's --eval-iters")
               ->capture_default_str(),
           ints_from<int64_t>(0));
  add_real(sub, "--weight-decay", o.adamw.weight_decay, "AdamW decoupled weight decay (not on norm weights)",
           reals_from(0))
      ->capture_default_str();
  in_range(sub->add_option("--lora-rank", o.lora.rank,
                           "LoRA: train rank-R adapters on the attention and MLP products of the frozen model "
                           "(--init-from); the output is the merged model.h5 and the PEFT adapter DIR/adapter "
                           "(0: full fine-tuning); --zero 3 also shards the frozen base. The CPU in fp32 for now")
               ->capture_default_str(),
           ints_between(0, 4096));
  add_real(sub, "--lora-alpha", o.lora.alpha, "LoRA: the adapters' update is scaled by alpha / rank", reals_above(0))
      ->capture_default_str();
  add_real(sub, "--lora-dropout", o.lora.dropout, "LoRA: dropout on the adapters' input while training",
           reals_in(0, 1, "[)"))
      ->capture_default_str();
  sub->add_option_function<std::string>(
         "--lora-targets", [&o](const std::string& list) { o.lora.targets = parse_lora_targets(list); },
         "LoRA: the products that carry adapters, among wq,wk,wv,wo,w1,w2,w3 (or HF's q_proj,...,up_proj)")
      ->default_str("wq,wk,wv,wo,w1,w2,w3");
  add_real(sub, "--beta1", o.adamw.beta1, "AdamW beta1", reals_in(0, 1, "[)"))->capture_default_str();
  add_real(sub, "--beta2", o.adamw.beta2, "AdamW beta2", reals_in(0, 1, "[)"))->capture_default_str();
  add_real(sub, "--adam-eps", o.adamw.eps, "AdamW epsilon", reals_above(0))->capture_default_str();
  add_real(sub, "--grad-clip", o.grad_clip, "Clip the global gradient norm to this (0: off)", reals_from(0))
      ->capture_default_str();
  in_range(sub->add_option("--seed", o.seed, "Seed for initialisation and data order")->capture_default_str(),
           ints_from<uint64_t>(0));
}

// Checkpoints, resume and what the run writes.
void add_output_options(CLI::App* sub, TrainOptions& o) {
  sub->add_option("--checkpoint-dir", o.checkpoint_dir,
                  "Write checkpoints here (DIR/step-N, DIR/latest): at every epoch end, every --checkpoint-every "
                  "steps, and on SIGTERM/SIGUSR1 (then exit with status 3)");
  in_range(sub->add_option("--checkpoint-every", o.checkpoint_every,
                           "Also checkpoint every N optimizer steps (0: epoch ends only)")
               ->capture_default_str(),
           ints_from<int64_t>(0));
  in_range(sub->add_option("--keep-last", o.keep_last, "Checkpoints to keep in --checkpoint-dir (0: all)")
               ->capture_default_str(),
           ints_from(0));
  sub->add_flag("--keep-best", o.keep_best,
                "With --eval-every: also keep the state of the lowest periodic test loss: its checkpoint, never "
                "pruned by --keep-last and named by --checkpoint-dir's best, and its weights as --output's "
                "best.h5 (model.h5 stays the last step's)");
  sub->add_option("--resume", o.resume,
                  "auto: continue from the newest valid checkpoint in --checkpoint-dir (if any); none; or a "
                  "checkpoint directory")
      ->capture_default_str();
  sub->add_flag("--allow-new-data", o.allow_new_data, "Resume on a dataset other than the checkpoint's");
  sub->add_flag("!--no-shuffle", o.shuffle, "Keep the dataset's row order instead of a seeded shuffle per epoch");
  sub->add_option("--output", o.output, "Directory for the final model (DIR/model.h5)");
  sub->add_flag("--save-init", o.save_init, "Also write the model as initialised, before the first step (DIR/init.h5)");
  sub->add_option("--metrics", o.metrics, "Write one JSON object per step and per epoch to this JSONL file");
  sub->add_flag("!--no-progress", o.progress, "No live progress line on stderr");
}

}  // namespace

CLI::App* setup_train(CLI::App& root, TrainCliOptions& opt) {
  CLI::App* sub = root.add_subcommand("train", "Train (pre-train or fine-tune) a Llama 2 model on a prepared HDF5 dataset");
  add_model_options(sub, opt.train);
  add_batch_options(sub, opt.train);
  add_parallel_options(sub, opt.train);
  add_schedule_options(sub, opt);
  add_output_options(sub, opt.train);
  return sub;
}

namespace {

// What no single option's range can say. Every rank finds the same, hence CollectiveError: one
// report, every rank exits.
void check_train_options(const TrainCliOptions& opt) {
  const TrainOptions& o = opt.train;
  const bool rank0 = world().rank == 0;
  // A given --min-lr above --lr is a mistake; the default one above a small --lr is what such
  // runs always got (the schedule rises to it), so it is only pointed out.
  if (o.min_lr > o.lr && opt.min_lr && opt.min_lr->count() > 0)
    throw CollectiveError(strcat("--min-lr ", o.min_lr, " is above --lr ", o.lr,
                                 "; the cosine schedule decays from --lr down to --min-lr"));
  if (o.min_lr > o.lr && rank0)
    std::fprintf(stderr,
                 "train: warning: --lr %g is below the default --min-lr %g, so the schedule rises toward "
                 "--min-lr; give --min-lr (e.g. %g)\n",
                 double(o.lr), double(o.min_lr), double(o.lr) / 10);
  if (o.keep_best && o.eval_every == 0)
    throw CollectiveError("--keep-best needs --eval-every N: it keeps the state of the lowest of those test losses");
  if (o.keep_best && o.checkpoint_dir.empty() && o.output.empty())
    throw CollectiveError("--keep-best needs --checkpoint-dir DIR or --output DIR: where the best state is kept");
  if (o.max_steps > 0 && o.warmup_steps > o.max_steps && rank0)
    std::fprintf(stderr,
                 "train: warning: --warmup-steps %lld is longer than the run (--max-steps %lld); the learning "
                 "rate never reaches --lr\n",
                 (long long)o.warmup_steps, (long long)o.max_steps);
}

// Before any work: the run's outputs can be written. Every rank writes its shard of each
// checkpoint, so every rank checks --checkpoint-dir; the model and the metrics are rank 0's
// (checking them elsewhere would leave empty directories on other nodes' disks). A rank that
// fails names itself and every rank exits (agree).
void check_train_outputs(const TrainOptions& o) {
  agree(world_comm(), [&] {
    // --output's default checkpoint directory is made inside it (a writable --output will do).
    if (!o.checkpoint_dir.empty() && !o.checkpoint_on_stop_only) check_writable_dir(o.checkpoint_dir, "--checkpoint-dir");
    if (world().rank != 0) return;
    const std::string out_model = o.output.empty() ? "" : o.output + "/model.h5";
    const std::string out_init = o.output.empty() || !o.save_init ? "" : o.output + "/init.h5";
    const std::string out_best = o.output.empty() || !o.keep_best ? "" : o.output + "/best.h5";
    refuse_output_over_input({{"--metrics", o.metrics}, {"--output", o.output}, {"--output (its model.h5)", out_model},
                              {"--output (its init.h5)", out_init}, {"--output (its best.h5)", out_best}},
                             {{"--data", o.data}, {"--init-from", o.init_from}, {"--tokenizer", o.tokenizer}});
    if (!o.output.empty()) check_writable_dir(o.output, "--output");
    if (!o.metrics.empty()) check_writable_file(o.metrics, "--metrics");
  });
}

// Without --checkpoint-dir a stop (Ctrl-C, SIGTERM, SIGUSR1) still keeps the run when it can: its
// checkpoint goes to --output's DIR/checkpoints, written only on a stop and removed when the run
// completes, provided every rank is on this host (ranks elsewhere would need a shared file system).
// Otherwise the trainer says once, at the start, that a stop will lose the run and what keeps it.
TrainOptions with_stop_checkpoints(TrainOptions o) {
  if (o.checkpoint_dir.empty() && !o.output.empty() && world().local_size == world().size) {
    o.checkpoint_dir = o.output + "/checkpoints";
    o.checkpoint_on_stop_only = true;
  }
  return o;
}

}  // namespace

int run_train(const TrainCliOptions& cli) {
  check_train_options(cli);
  const TrainOptions opt = with_stop_checkpoints(cli.train);
  check_train_outputs(opt);
  const TrainResult r = run_training(opt);
  if (r.already_complete) return 0;  // a finished run rerun (a requeue): said so, nothing done
  if (world().rank == 0 && r.window_steps > 0)
    std::fprintf(stderr, "train: %lld steps in %.1f s, loss %.4f -> %.4f (means over the first and the last %d steps)\n",
                 (long long)(r.steps - r.start_step), r.seconds, r.first_window_loss, r.last_window_loss, r.window_steps);
  if (r.state_not_saved) {
    if (world().rank == 0) std::fprintf(stderr, "%s\n", r.state_report.c_str());  // where the newest saved state is
    return kExitStateNotSaved;
  }
  return r.stopped_by_signal ? kExitStoppedBySignal : 0;
}

}  // namespace lt::cli
