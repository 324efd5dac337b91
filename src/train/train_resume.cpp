// Resume: the newest checkpoint that matches this run and loads on every rank.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "train/train_parts.h"

namespace lt {

namespace {

// What a LoRA checkpoint must share with the run resuming it: the adapters' shape and scale and the
// frozen base, by the SHA-256 of the --init-from file (of each regular file of a directory, by name),
// or the seed of a random base.
std::string lora_identity(const TrainOptions& opt) {
  if (!opt.lora.enabled()) return "";
  const LoraConfig& c = opt.lora;
  std::string base;
  if (opt.init_from.empty()) {
    base = strcat("random ", opt.model_config, " seed ", opt.seed);
  } else if (std::filesystem::is_directory(opt.init_from)) {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(opt.init_from))
      if (e.is_regular_file()) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    std::string sums;
    for (const std::string& f : files) sums += f + " " + sha256_file(opt.init_from + "/" + f) + "\n";
    base = "directory sha256 " + sha256_hex(sums);
  } else {
    base = "sha256 " + sha256_file(opt.init_from);
  }
  return strcat("rank ", c.rank, ", alpha ", c.alpha, ", dropout ", c.dropout, ", targets ",
                lora_targets_string(c.targets), "; base ", base);
}

// Rank 0 hashes the base (a 7B model's file is 13 GB: read once, not once per rank) and every rank
// gets its text (a collective).
std::string lora_identity_everywhere(const TrainOptions& opt, Comm& comm) {
  std::string id;
  agree(comm, [&] {
    if (comm.rank() == 0) id = lora_identity(opt);
  });
  uint64_t n = id.size();
  comm.broadcast(&n, sizeof n, 0);
  id.resize(size_t(n));
  if (n) comm.broadcast(id.data(), size_t(n), 0);
  return id;
}

}  // namespace

RunIdentity run_identity(const TrainSetup& setup, const TrainOptions& opt, Comm& comm) {
  RunIdentity r;
  r.lora = lora_identity_everywhere(opt, comm);
  r.model_config = setup.cfg.to_string();
  r.tokenizer_sha256 = setup.ds.tokenizer_model.empty() ? std::string() : sha256_hex(setup.ds.tokenizer_model);
  r.data_identity = dataset_identity(setup.ds);
  r.global_batch = setup.global_batch;
  return r;
}

std::string checkpoint_mismatch(const CheckpointInfo& ci, const std::string& path, const RunIdentity& run,
                                bool allow_new_data) {
  if (ci.model_config != run.model_config)
    return strcat(path, ": a checkpoint of another model (", ci.model_config, "); this run trains ", run.model_config);
  if (ci.lora != run.lora)
    return ci.lora.empty() ? strcat(path, ": a checkpoint of full fine-tuning; this run trains LoRA adapters (", run.lora, ")")
           : run.lora.empty()
               ? strcat(path, ": a checkpoint of a LoRA run (", ci.lora, "); this run fine-tunes the whole model")
               : strcat(path, ": a checkpoint of other LoRA adapters or another base (", ci.lora, "); this run has ",
                        run.lora);
  if (ci.tokenizer_sha256 != run.tokenizer_sha256)
    return strcat(path, ": written with another tokenizer (sha256 ", ci.tokenizer_sha256.substr(0, 12),
                  "…) than the dataset's (", run.tokenizer_sha256.substr(0, 12), "…)");
  if (ci.data_identity != run.data_identity && !allow_new_data)
    return strcat(path, ": written while training on other data (", ci.data_identity, "); this run has ",
                  run.data_identity, ". Pass --allow-new-data to continue on the new data");
  if (ci.global_batch != run.global_batch)
    return strcat(path, ": written with a global batch of ", ci.global_batch, " sequences; this run has ",
                  run.global_batch, " (the data cursor counts steps of that size)");
  return "";
}

namespace {

// The schedule a checkpoint records (total_steps 0 when it does not).
LrSchedule recorded_schedule(const TrainingRecord& r) {
  return LrSchedule{r.lr, r.min_lr, r.warmup_steps, r.total_steps};
}

}  // namespace

std::string schedule_change(const LrSchedule& before, const LrSchedule& now, int64_t step) {
  if (before.total_steps <= 0) return "";
  if (before.total_steps == now.total_steps && before.warmup_steps == now.warmup_steps &&
      before.max_lr == now.max_lr && before.min_lr == now.min_lr)
    return "";
  std::string s = strcat("train: the learning-rate schedule changes at step ", step, ": ");
  if (before.total_steps != now.total_steps)
    s += strcat(before.total_steps, " -> ", now.total_steps, " total steps, so the cosine decay to ", now.min_lr,
                " now ends at step ", now.total_steps, " instead of ", before.total_steps);
  else
    s += strcat(now.total_steps, " total steps as before");
  if (before.warmup_steps != now.warmup_steps)
    s += strcat("; warm-up ", before.warmup_steps, " -> ", now.warmup_steps, " steps");
  if (before.max_lr != now.max_lr || before.min_lr != now.min_lr)
    s += strcat("; lr ", before.max_lr, " -> ", now.max_lr, ", min lr ", before.min_lr, " -> ", now.min_lr);
  char lrs[96];
  std::snprintf(lrs, sizeof lrs, "; lr of step %lld %.4g (was %.4g)", (long long)step + 1, double(now.at(step)),
                double(before.at(step)));
  return s + lrs;
}

ResumePoint resume_training(const TrainOptions& opt, const RunIdentity& run, int64_t micro_batches, TrainModel& m,
                            Comm& comm, bool say) {
  if (opt.resume.empty()) throw CollectiveError("train: --resume needs auto, none or a checkpoint directory");
  const int W = comm.size();
  const bool explicit_path = opt.resume != "auto" && opt.resume != "none";
  std::vector<std::string> candidates;
  if (explicit_path) candidates = {opt.resume};
  else if (opt.resume == "auto" && !opt.checkpoint_dir.empty()) candidates = list_checkpoints(opt.checkpoint_dir);
  AdamW& adam = m.zero.adamw();
  ResumePoint rp;
  int damaged = 0;
  for (const std::string& cand : candidates) {
    // 0 loaded, 1 damaged (try the previous one), 2 refused (stop: the run does not match).
    int kind = 0;
    std::string msg;
    CheckpointInfo ci;
    try {
      ci = read_checkpoint_info(cand);
    } catch (const Error& e) {
      kind = 1, msg = e.what();
    }
    if (kind == 0) {
      msg = checkpoint_mismatch(ci, cand, run, opt.allow_new_data);
      if (!msg.empty()) kind = 2;
    }
    if (kind == 0) {
      try {
        if (m.zero.sharded_params())
          load_checkpoint_state(cand, m.model.layout(), m.zero.shard_params().data(), adam.begin(), adam.end(),
                                adam.m().data(), adam.v().data(), /*params_whole=*/false);
        else if (const LoraLayout* lora = m.model.lora())  // the adapters; the base is --init-from's
          load_checkpoint_state(cand, lora->table(), m.model.lora_params().data(), adam.begin(), adam.end(),
                                adam.m().data(), adam.v().data());
        else
          load_checkpoint_state(cand, m.model.layout(), m.model.params().data(), adam.begin(), adam.end(),
                                adam.m().data(), adam.v().data());
      } catch (const Error& e) {
        kind = 1, msg = e.what();
      }
    }
    int worst = 0;
    for (double k : comm.allgather_values({double(kind)})) worst = std::max(worst, int(k));
    if (worst == 2) agree_on_error(comm, kind == 2 ? &msg : nullptr);
    if (worst == 1) {
      std::string why;
      try {
        agree_on_error(comm, kind == 1 ? &msg : nullptr);
      } catch (const CollectiveError& e) {
        why = e.what();
      }
      if (explicit_path) throw CollectiveError(strcat("train: --resume ", cand, ": ", why));
      ++damaged;
      if (say) std::fprintf(stderr, "train: warning: skipping damaged checkpoint %s: %s\n", cand.c_str(), why.c_str());
      continue;
    }
    rp.step = ci.step;
    rp.path = cand;
    rp.schedule = recorded_schedule(ci.training);
    rp.best_eval_step = ci.best_eval_step;
    rp.best_eval_loss = ci.best_eval_loss;
    int sum = 0;
    for (int k : ci.split) sum += k;
    if (ci.world_size == W && int(ci.split.size()) == W && sum == micro_batches) rp.split = ci.split;
    if (say)
      std::fprintf(stderr, "train: resumed from %s at step %lld (written by %d rank(s) with ZeRO stage %d)\n",
                   cand.c_str(), (long long)rp.step, ci.world_size, ci.zero_stage);
    break;
  }
  if (rp.path.empty() && damaged > 0)
    throw CollectiveError(strcat("train: no usable checkpoint in ", opt.checkpoint_dir, ": all ", damaged,
                                 " are damaged (see above); move them away to start afresh"));
  return rp;
}

}  // namespace lt
