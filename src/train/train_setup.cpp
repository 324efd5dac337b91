// Setup of a training run: the options and inputs checked alike on every rank, the model with
// its optimizer and device, and every rank's device.

#include <omp.h>

#include <cstdio>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/memory.h"
#include "llamatrain/model_check.h"
#include "llamatrain/plan.h"
#include "llamatrain/runtime.h"
#include "llamatrain/tokenizer.h"
#include "train/train_parts.h"

namespace lt {

void ModelOverrides::apply(Llama2Config& c) const {
  if (dim > 0) c.dim = dim;
  if (hidden_dim > 0) c.hidden_dim = hidden_dim;
  if (n_layers > 0) c.n_layers = n_layers;
  if (n_heads > 0) c.n_heads = n_heads;
  if (n_kv_heads > 0) c.n_kv_heads = n_kv_heads;
  if (vocab_size > 0) c.vocab_size = vocab_size;
  if (max_seq_len > 0) c.max_seq_len = max_seq_len;
}

void check_data_fits_model(const Dataset& ds, const Llama2Config& cfg, const std::string& model_tokenizer,
                           const std::string& model_origin, TokenizerCheck check) {
  if (ds.info.vocab_size > cfg.vocab_size)
    fail(strcat(ds.path, ": the dataset's vocabulary (", ds.info.vocab_size,
                " tokens) does not fit the model's vocab_size ", cfg.vocab_size, " (", model_origin, ")"));
  if (ds.info.seq_len > cfg.max_seq_len)
    fail(strcat(ds.path, ": seq_len ", ds.info.seq_len, " exceeds the model's max_seq_len ", cfg.max_seq_len,
                " (", model_origin, ")"));
  if (check == TokenizerCheck::kNone || ds.info.tokenizer_sha256.empty()) return;
  std::string problem;
  if (model_tokenizer.empty()) {
    // A format without a tokenizer (llama2.c .bin): only the vocabulary size can be compared.
    problem = strcat(model_origin, " stores no tokenizer, so it cannot be checked against the one ", ds.path,
                     " was prepared with (sha256 ", ds.info.tokenizer_sha256.substr(0, 12), "…, ",
                     ds.info.vocab_size, " pieces; the model's vocab_size is ", cfg.vocab_size,
                     ds.info.vocab_size == cfg.vocab_size ? "" : ", so they differ", ")");
    if (check == TokenizerCheck::kStrict)
      fail(strcat(problem, "; pass --tokenizer TOK.model, the model's tokenizer (it must be the data's), or "
                           "--allow-tokenizer-mismatch"));
  } else if (sha256_hex(model_tokenizer) != ds.info.tokenizer_sha256) {
    problem = strcat(ds.path, ": tokenized with another tokenizer (sha256 ", ds.info.tokenizer_sha256.substr(0, 12),
                     "…) than ", model_origin, "'s (sha256 ", sha256_hex(model_tokenizer).substr(0, 12), "…)");
    if (check == TokenizerCheck::kStrict)
      fail(strcat(problem, "; prepare the data with the model's tokenizer (prepare --tokenizer TOK.model), or "
                           "pass --allow-tokenizer-mismatch"));
  }
  if (!problem.empty()) std::fprintf(stderr, "warning: %s (--allow-tokenizer-mismatch)\n", problem.c_str());
}

StepCounts count_steps(int64_t n_train_seq, int64_t global_batch, int64_t max_steps, int64_t epochs) {
  StepCounts c;
  c.steps_per_epoch = n_train_seq / global_batch;
  c.total_steps = max_steps > 0 ? max_steps : c.steps_per_epoch * epochs;
  c.n_epochs = (c.total_steps + c.steps_per_epoch - 1) / c.steps_per_epoch;
  return c;
}

// What memory_table will report for one rank (working parameters, gradients, Adam m and v of the
// rank's share, activations of one micro-batch), times the ranks on this node, checked before
// the model is allocated. Counted in doubles so that absurd dimensions cannot overflow. The
// CUDA backend keeps most of this in device memory, so only CPU runs are checked here.
void check_training_memory(const Llama2Config& cfg, const TrainOptions& opt, int seq_len, Recompute recompute,
                           DeviceKind device, int world_size) {
  if (device == DeviceKind::cuda) return;
  const double C = cfg.dim, F = cfg.hidden_dim, V = cfg.vocab_size, KV = double(cfg.kv_dim());
  const double per_layer = 2 * C + 2 * C * C + 2 * C * KV + 3 * C * F;
  const double params = V * C * (cfg.tied_embeddings ? 1 : 2) + cfg.n_layers * per_layer + C;
  const double adam = 8 * params / (opt.zero_stage == 0 ? 1 : world_size);
  // LoRA: the frozen base alone (ZeRO 3: the rank's shard), no gradient or Adam state of it (the
  // adapters' are a fraction of a percent).
  const double state = !opt.lora.enabled() ? 8 * params + adam : 4 * params / (opt.zero_stage == 3 ? world_size : 1);
  const double activations = plan_activation_bytes(cfg, opt.batch_size, seq_len, recompute, 4);
  const int here = world().local_size;
  check_memory_fits((state + activations) * here,
                    strcat("train: the model (", cfg.to_string(), ", ", params, " parameters) with micro-batches of ",
                           opt.batch_size, " x ", seq_len, " tokens on ", here, " rank(s) of this node"),
                    "use a smaller model or --batch-size, --recompute, --zero 1/2, or more nodes");
}

namespace {

// What LoRA training does not cover yet (issue 36), refused before any work.
void check_lora_options(const TrainOptions& opt, DeviceKind device) {
  if (!opt.lora.enabled()) return;
  if (device != DeviceKind::cpu && opt.offload_optimizer)
    fail("train: --offload-optimizer with --lora-rank: the adapters' optimizer already runs on the host");
}

}  // namespace

TrainSetup check_training_setup(const TrainOptions& opt, Comm& comm) {
  const int W = comm.size();
  TrainSetup s;
  s.weights.assign(size_t(W), 1.0);
  // agree() makes sure a rank that fails alone does not leave the others waiting.
  agree(comm, [&] {
    if (opt.data.empty()) fail("train: --data DATA.h5 is required");
    if (opt.batch_size <= 0) fail(strcat("train: --batch-size ", opt.batch_size, ", expected > 0"));
    if (opt.grad_accum <= 0) fail(strcat("train: --grad-accum ", opt.grad_accum, ", expected > 0"));
    if (opt.epochs <= 0 && opt.max_steps <= 0) fail("train: need --epochs > 0 or --max-steps > 0");
    if (!(opt.lr > 0)) fail(strcat("train: --lr ", opt.lr, ", expected > 0"));
    if (opt.zero_stage < 0 || opt.zero_stage > 3)
      fail(strcat("train: --zero ", opt.zero_stage, ", expected 0, 1, 2 or 3"));
    s.recompute = opt.recompute;
    s.precision = opt.precision;
    s.balance = opt.balance;
    if (!opt.rank_weights.empty()) {
      if (s.balance == BalanceMode::kOff) fail("train: --rank-weights needs --balance static or auto");
      s.weights = parse_rank_weights(opt.rank_weights, W);
    } else if (s.balance == BalanceMode::kStatic) {
      fail("train: --balance static needs --rank-weights w0,w1,... (one per rank)");
    }
    if (opt.eval_every < 0) fail(strcat("train: --eval-every ", opt.eval_every, ", expected >= 0"));
    if (opt.eval_batches < 0) fail(strcat("train: --eval-batches ", opt.eval_batches, ", expected >= 0"));
    if (opt.rebalance_every <= 0) fail(strcat("train: --rebalance-every ", opt.rebalance_every, ", expected > 0"));
    if (!opt.simulate_slowdown.empty()) s.slowdown = parse_slowdown(opt.simulate_slowdown, W);
    s.global_batch = opt.global_batch > 0 ? opt.global_batch : int64_t(opt.batch_size) * opt.grad_accum * W;
    if (s.global_batch % opt.batch_size != 0)
      fail(strcat("train: --global-batch ", s.global_batch, " is not a multiple of --batch-size ", opt.batch_size,
                  " (every rank runs whole micro-batches of one shape)"));
    s.micro_batches = s.global_batch / opt.batch_size;
    if (s.balance == BalanceMode::kAuto && s.micro_batches < W)
      fail(strcat("train: --balance auto needs at least one micro-batch per rank, but the global batch of ",
                  s.global_batch, " is ", s.micro_batches, " micro-batches of ", opt.batch_size, " for ", W, " ranks"));

    s.device = resolve_device(opt.device);
    if (opt.attention != Attention::kNative && s.device != DeviceKind::cuda)
      fail(strcat("train: --attention ", attention_name(opt.attention),
                  " runs only on a GPU (cuDNN), but this run uses --device ",
                  device_name(s.device), "; use --attention native"));
    if (s.device != DeviceKind::cpu && opt.precision_given && s.precision != Precision::kBf16)
      fail(strcat("train: --precision ", precision_name(opt.precision), " on --device ", device_name(s.device),
                  ": the CUDA backend computes in bf16 only (fp32 is the CPU's)"));
    if (opt.offload_optimizer && s.device == DeviceKind::cpu)
      fail("train: --offload-optimizer moves a device's optimizer state to the host, but --device cpu keeps it "
           "there already; drop the option");
    if (opt.offload_optimizer && opt.zero_stage == 0)
      fail("train: --offload-optimizer needs --zero 1, 2 or 3 (the host keeps its rank's shard of the optimizer "
           "state; at ZeRO 0 every rank would hold all of it)");
    s.ds = Dataset::load(opt.data);
    // The model: a checkpointed one to fine-tune, or a preset with overrides, randomly initialised.
    if (!opt.init_from.empty() && host_holds_only_shard(s.device, opt.zero_stage, opt.lora.enabled()) &&
        detect_model_format(opt.init_from) == ModelFormat::kHdf5) {
      s.init = load_model_header(opt.init_from);  // the weights: each rank its shard (TrainModel)
      s.init_by_shard = true;
      s.cfg = s.init.config;
    } else if (!opt.init_from.empty()) {
      s.init = load_model(opt.init_from);
      check_finite_parameters(s.init);
      s.cfg = s.init.config;
    } else {
      s.cfg = preset_config(opt.model_config);
      opt.overrides.apply(s.cfg);
      s.cfg.validate();
    }
    // The model's tokenizer: stored in it, else --tokenizer (for a format that stores none).
    std::string model_tokenizer = s.init.tokenizer_model, tokenizer_origin = opt.init_from;
    if (model_tokenizer.empty() && !opt.tokenizer.empty()) {
      if (!file_exists(opt.tokenizer)) fail(strcat(opt.tokenizer, ": tokenizer file not found (--tokenizer)"));
      refuse_special_file(opt.tokenizer, "tokenizer file (--tokenizer)");
      model_tokenizer = Tokenizer::load(opt.tokenizer).serialized();
      tokenizer_origin = strcat(opt.init_from, " (tokenizer ", opt.tokenizer, ")");
    }
    check_data_fits_model(s.ds, s.cfg, model_tokenizer,
                          opt.init_from.empty() ? strcat("--model-config ", opt.model_config) : tokenizer_origin,
                          opt.init_from.empty()           ? TokenizerCheck::kNone
                          : opt.allow_tokenizer_mismatch ? TokenizerCheck::kWarn
                                                         : TokenizerCheck::kStrict);
    check_lora_options(opt, s.device);
    check_training_memory(s.cfg, opt, s.ds.info.seq_len, s.recompute, s.device, W);
    if (s.ds.train.loss_tokens() == 0)
      fail(strcat(opt.data, ": /train/loss_mask is all zeros: no training token carries loss, so there is nothing to "
                            "learn (for --qa data: answers cut off by --seq-len? prepare with a longer --seq-len, or "
                            "--train-on-prompt)"));
    if (opt.eval_every > 0 && s.ds.test.n_seq == 0)
      fail(strcat(opt.data, ": no test split to evaluate every ", opt.eval_every,
                  " steps (--eval-every); prepare the data with --test-split > 0"));
    if (s.ds.train.n_seq < s.global_batch)
      fail(strcat(opt.data, ": ", s.ds.train.n_seq, " training sequences, fewer than one optimizer step (global batch ",
                  s.global_batch, " = ", s.micro_batches, " micro-batches of ", opt.batch_size, ")"));
    if (comm.rank() == 0 && !opt.output.empty()) make_dirs(opt.output);
  });
  // One backend on every rank (--device auto could pick a GPU on some nodes only): the CPU's and a
  // device's ZeRO collectives are not the same calls.
  const std::vector<double> kinds = comm.allgather_values({double(int(s.device))});
  agree(comm, [&] {
    for (int r = 1; r < W; ++r)
      if (kinds[size_t(r)] != kinds[0])
        fail(strcat("train: --device ", device_choice_name(opt.device), " is ", device_name(DeviceKind(int(kinds[0]))), " on rank 0 but ",
                    device_name(DeviceKind(int(kinds[size_t(r)]))), " on rank ", r,
                    "; a job runs one backend on every rank: pass --device cpu, or run on nodes alike"));
  });
  s.steps = count_steps(s.ds.train.n_seq, s.global_batch, opt.max_steps, opt.epochs);
  if (opt.lora.enabled()) s.lora_flops_delta = LoraLayout(s.cfg, opt.lora).flops_per_token_delta();
  s.rss_before_model = host_rss_bytes();
  return s;
}

namespace {

// The optimizer of what the run trains: the whole model, or with LoRA its adapters (made here),
// which ZeRO 2 and 3 train as stage 1 does: their gradients, a fraction of a percent of the
// model's, stay whole and are reduce-scattered after the passes (stage 3 shards the frozen base
// instead: FrozenShards).
ZeroOptimizer make_optimizer(Comm& comm, Llama2Model& model, const TrainOptions& opt) {
  if (!opt.lora.enabled())
    return ZeroOptimizer(comm, model.layout(), opt.zero_stage, opt.adamw, opt.grad_reduce_dtype,
                         size_t(opt.bucket_mb) << 20);
  model.enable_lora(opt.lora, opt.seed + 0x10a);  // A's draws apart from the base's
  const LoraLayout& lora = *model.lora();
  return ZeroOptimizer(comm, lora.tensors(), lora.total(), std::min(opt.zero_stage, 1), opt.adamw,
                       opt.grad_reduce_dtype);
}

// The initial weights' flat range [begin, end): read from an HDF5 --init-from (a range per rank),
// copied from --init-from's whole model (which is dropped after), or computed from the seed (the
// range's values of the whole model's random stream).
void init_weight_range(TrainSetup& setup, const TrainOptions& opt, Comm& comm, const ParameterLayout& layout,
                       size_t begin, size_t end, float* out) {
  if (setup.init_by_shard) {
    agree(comm, [&] {
      read_model_range(opt.init_from, layout, begin, end, out);
      check_finite_parameters(opt.init_from, layout, begin, end, out);
    });
  } else if (!opt.init_from.empty()) {
    std::copy(setup.init.params.begin() + std::ptrdiff_t(begin), setup.init.params.begin() + std::ptrdiff_t(end), out);
    std::vector<float>().swap(setup.init.params);
  } else {
    Llama2Model::init_random_range(setup.cfg, layout, opt.seed, begin, end, out);
  }
}

}  // namespace

TrainModel::TrainModel(TrainSetup& setup, const TrainOptions& opt, Comm& comm, bool say)
    : model(setup.cfg, /*allocate_params=*/!host_holds_only_shard(setup.device, opt.zero_stage, opt.lora.enabled())),
      zero(make_optimizer(comm, model, opt)),
      n_params(model.layout().total()) {
  model.set_recompute(setup.recompute);
  if (host_holds_only_shard(setup.device, opt.zero_stage, opt.lora.enabled())) {
    // Only this rank's shard of the weights, ever (engine.h): zero's, or with LoRA the frozen
    // base's, which the passes gather.
    if (model.lora()) frozen_base = std::make_unique<FrozenShards>(comm, model.layout());
    else zero.hold_shard_params();
    float* mine = frozen_base ? frozen_base->params().data() : zero.shard_params().data();
    const size_t begin = frozen_base ? frozen_base->own_begin() : zero.own_begin();
    const size_t end = frozen_base ? frozen_base->own_end() : zero.own_end();
    init_weight_range(setup, opt, comm, model.layout(), begin, end, mine);
  } else {
    if (!opt.init_from.empty()) model.params() = std::move(setup.init.params);
    else model.init_random(opt.seed);
    // Padded to a multiple of the world size for the sharded collectives (not the frozen base of
    // LoRA, which is never sharded here); the padding stays 0.
    if (!model.lora()) model.params().resize(zero.padded_size(), 0.f);
    // Every rank starts from rank 0's weights, whatever the initialisation did elsewhere.
    comm.broadcast(model.params().data(), n_params * sizeof(float), 0);
  }
  if (model.lora()) share_adapters(comm);
  build_engine(setup, opt, say);
}

// LoRA: the adapters, what ZeRO pads and updates, as rank 0 initialised them, everywhere.
void TrainModel::share_adapters(Comm& comm) {
  model.lora_params().resize(zero.padded_size(), 0.f);
  model.lora_grads().resize(zero.padded_size(), 0.f);
  comm.broadcast(model.lora_params().data(), model.lora()->total() * sizeof(float), 0);
}

void TrainModel::build_engine(const TrainSetup& setup, const TrainOptions& opt, bool say) {
  if (setup.device == DeviceKind::cpu) {
    set_cpu_precision(model, setup.precision, "train", say);
    engine = make_cpu_engine(model, zero, frozen_base.get());
    return;
  }
  DeviceEngineSpec spec;
  spec.cfg = setup.cfg;
  spec.local_rank = world().local_rank;
  spec.attention = opt.attention;
  spec.recompute = setup.recompute;
  spec.collectives = {opt.comm_timeout, size_t(opt.bucket_mb) << 20, opt.zero3_prefetch, opt.offload_optimizer};
  spec.frozen_base = frozen_base.get();
  engine = make_device_engine(setup.device, spec, model, zero);
  if (say) std::fprintf(stderr, "train: device %s: %s\n", device_name(setup.device), engine->description().c_str());
}

// On GPUs the measured rates also give the balancer its starting weights (auto without
// --rank-weights), so A100 and H100 ranks start near their right share.
RankDevices gather_rank_devices(const DeviceInfo& mine, Comm& comm) {
  RankDevices d;
  d.hosts = comm.allgather_strings(world().host);
  d.names = comm.allgather_strings(mine.name);
  d.nums = comm.allgather_values({double(mine.sm_count), mine.memory_bytes, double(mine.cc_major),
                                  double(mine.cc_minor), mine.gemm_tflops, mine.peak_tflops,
                                  double(omp_get_max_threads())});
  d.gemm_what = mine.gemm_what;
  d.peak_what = mine.peak_what;
  return d;
}

std::vector<double> RankDevices::gemm_tflops() const {
  std::vector<double> t(hosts.size());
  for (size_t r = 0; r < t.size(); ++r) t[r] = gemm_tflops(int(r));
  return t;
}

}  // namespace lt
