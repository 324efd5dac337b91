// Helpers shared by the subcommands that take a model and a tokenizer.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "llamatrain/engine.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/tokenizer.h"

namespace lt::cli {

// load_model, then its notes (which checkpoint a checkpoint root resolved to, damaged ones
// skipped) on stderr as "<cmd>: <note>".
ModelData load_model_noting(const char* cmd, const std::string& model_path);

// The tokenizer given by --tokenizer, else the one stored inside the model file; errors say
// which file was expected.
Tokenizer tokenizer_for(const std::string& tokenizer_path, const ModelData& model,
                        const std::string& model_path);
// Refuses a tokenizer whose vocabulary does not match the model's.
void check_tokenizer_fits(const Tokenizer& tok, const std::string& tokenizer_origin,
                          const Llama2Config& cfg, const std::string& model_path);

// A model ready to run with its tokenizer (--tokenizer, else the one stored in the model file).
struct LoadedModel {
  Llama2Model model;
  Tokenizer tokenizer;
  std::optional<TrainingRecord> training;  // how `train` made it, when the file says
};
LoadedModel load_model_and_tokenizer(const char* cmd, const std::string& model_path, const std::string& tokenizer_path);

// The evaluator of `model` on --device (auto | cpu | cuda | cuda-sim), said on stderr as
// "<cmd>: device <name>: <description>" off the CPU; on the CPU, `precision` is its products'
// (set_cpu_precision), a CUDA device computes in bf16.
std::unique_ptr<Evaluator> evaluator_on(const char* cmd, DeviceChoice device, Llama2Model& model,
                                        Precision precision);

// --lora DIR, a PEFT LoRA adapter (peft_adapter.h) for the model, said on stderr as "<cmd>: ...":
// attached to `model` unmerged (eval's passes apply it; the CPU in fp32 only, refused elsewhere by
// evaluator_on), or merged into `params` of a model `cfg` in memory (generate's decoder, eval
// --task's answers, convert --merge-lora).
void attach_lora_dir(const char* cmd, const std::string& dir, Llama2Model& model);
void merge_lora_dir(const char* cmd, const std::string& dir, const Llama2Config& cfg, std::vector<float>& params);

}  // namespace lt::cli
