#include "cli/common.h"

#include <cstdio>

#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/model_check.h"
#include "llamatrain/peft_adapter.h"
#include "llamatrain/runtime.h"

namespace lt::cli {

ModelData load_model_noting(const char* cmd, const std::string& model_path) {
  ModelData md = load_model(model_path);
  check_finite_parameters(md);
  for (const auto& n : md.notes) std::fprintf(stderr, "%s: %s\n", cmd, n.c_str());
  return md;
}

Tokenizer tokenizer_for(const std::string& tokenizer_path, const ModelData& model,
                        const std::string& model_path) {
  if (!tokenizer_path.empty()) {
    if (!file_exists(tokenizer_path)) fail(strcat(tokenizer_path, ": tokenizer file not found (--tokenizer)"));
    refuse_special_file(tokenizer_path, "tokenizer file (--tokenizer)");
    return Tokenizer::load(tokenizer_path);
  }
  if (model.tokenizer_model.empty()) {
    if (model.format == ModelFormat::kCheckpoint)
      fail(strcat(model.source, ": the checkpoint stores no tokenizer (its training data recorded none); pass "
                  "--tokenizer TOK.model, the one the training data was prepared with"));
    fail(strcat(model_path, ": the model file carries no tokenizer; pass --tokenizer TOK.model"));
  }
  const std::string origin = model.format == ModelFormat::kCheckpoint ? model.source + "/checkpoint.h5" : model_path;
  return Tokenizer::from_serialized(model.tokenizer_model, origin + ":/tokenizer/model");
}

void check_tokenizer_fits(const Tokenizer& tok, const std::string& tokenizer_origin,
                          const Llama2Config& cfg, const std::string& model_path) {
  if (tok.vocab_size() > cfg.vocab_size)
    fail(strcat(tokenizer_origin, ": tokenizer has ", tok.vocab_size(), " pieces but ", model_path,
                " has vocab_size ", cfg.vocab_size, " (wrong tokenizer for this model?)"));
}

LoadedModel load_model_and_tokenizer(const char* cmd, const std::string& model_path,
                                     const std::string& tokenizer_path) {
  ModelData md = load_model_noting(cmd, model_path);
  Tokenizer tok = tokenizer_for(tokenizer_path, md, model_path);
  check_tokenizer_fits(tok, tokenizer_path.empty() ? model_path : tokenizer_path, md.config, model_path);
  LoadedModel m{Llama2Model(md.config), std::move(tok), md.training};
  m.model.params() = std::move(md.params);
  return m;
}

std::unique_ptr<Evaluator> evaluator_on(const char* cmd, DeviceChoice device, Llama2Model& model,
                                        Precision precision) {
  const DeviceKind kind = resolve_device(device);
  if (kind == DeviceKind::cpu) {
    set_cpu_precision(model, precision, cmd, true);
    return make_cpu_evaluator(model);
  }
  std::unique_ptr<Evaluator> e = make_evaluator(kind, model, world().local_rank);
  std::fprintf(stderr, "%s: device %s: %s\n", cmd, device_name(kind), e->description().c_str());
  return e;
}

namespace {

void say_adapter(const char* cmd, const std::string& dir, const LoraConfig& c, size_t n, const char* how) {
  std::fprintf(stderr, "%s: LoRA adapter %s: r %d, alpha %g, targets %s, %zu parameters, %s\n", cmd, dir.c_str(),
               c.rank, double(c.alpha), lora_targets_string(c.targets).c_str(), n, how);
}

}  // namespace

void attach_lora_dir(const char* cmd, const std::string& dir, Llama2Model& model) {
  PeftAdapter a = read_peft_adapter(dir, model.config());
  model.enable_lora(a.config, 0);
  model.lora_params() = std::move(a.params);
  say_adapter(cmd, dir, a.config, model.lora_params().size(), "applied unmerged");
}

void merge_lora_dir(const char* cmd, const std::string& dir, const Llama2Config& cfg, std::vector<float>& params) {
  const PeftAdapter a = read_peft_adapter(dir, cfg);
  const ParameterLayout layout(cfg);
  LT_CHECK(params.size() >= layout.total(), "merge_lora_dir: ", params.size(), " weights for a model of ", layout.total());
  merge_lora(LoraLayout(cfg, a.config), a.params.data(), layout, params.data());
  say_adapter(cmd, dir, a.config, a.params.size(), "merged into the weights in memory");
}

}  // namespace lt::cli
