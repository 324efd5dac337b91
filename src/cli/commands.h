// Subcommands: one options struct and a setup_<cmd> / run_<cmd> pair each (CLI11 style).
// setup_<cmd> adds the subcommand and its options to the root app; run_<cmd> runs it and
// returns the process exit status. Errors are thrown as lt::Error and reported by main.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/prompt_options.h"
#include "llamatrain/trainer.h"

namespace lt::cli {

// What the llamatrain executable was linked with (main.cpp knows; the core library does not).
struct BuildInfo {
  bool cuda_gpu = false;   // the nvcc-built CUDA backend (--device cuda)
  bool cuda_sim = false;   // the CUDA backend on the CPU simulator (--device cuda-sim)
  std::string cuda_archs;  // CMAKE_CUDA_ARCHITECTURES of the GPU build, e.g. "80 90"
};

struct InfoOptions {
  std::string hostfile;  // --hostfile F: check an Open MPI hostfile and print its inventory
  BuildInfo build;       // set by main, not an option
};
CLI::App* setup_info(CLI::App& root, InfoOptions& opt);
int run_info(const InfoOptions& opt);

struct PrepareOptions {
  std::string text;           // --text FILE (plain text)
  std::string qa;             // --qa FILE (question/context/answer records)
  PromptCliOptions prompt;    // --prompt-type 1|2|3 (default 1), --template, --system
  std::string answer_field = "long_answer";  // --answer-field long_answer|final_decision|both
  std::string test_ids;       // --test-ids FILE: the test split is exactly these ids
  bool train_on_prompt = false;
  int decision_weight = 1;  // --decision-weight W (prepare_qa's)
  int min_answer_tokens = 1;
  bool skip_invalid = false;
  bool compare_sentencepiece = false;
  int seq_len = 256;          // --seq-len
  std::string output;         // --output DATA.h5
  std::string tokenizer;      // --tokenizer TOK.model (else one is trained)
  int vocab_size = 512;       // --vocab-size (when training a tokenizer)
  std::string model_type = "bpe";  // --tokenizer-type bpe|unigram
  double test_split = 0.1;    // --test-split F
  const CLI::Option* test_split_option = nullptr;  // set by setup_prepare: was --test-split given?
  uint64_t seed = 1234;       // --seed
};
CLI::App* setup_prepare(CLI::App& root, PrepareOptions& opt);
int run_prepare(const PrepareOptions& opt);

struct TrainCliOptions {
  lt::TrainOptions train;
  const CLI::Option* min_lr = nullptr;  // set by setup_train: was --min-lr given (or in the config)?
};
CLI::App* setup_train(CLI::App& root, TrainCliOptions& opt);
int run_train(const TrainCliOptions& opt);

struct EvalOptions {
  std::string model;      // --model M (HDF5 or llama2.c .bin)
  std::string tokenizer;  // --tokenizer T (.model); default: the one inside an HDF5 model
  std::string text;       // --text FILE
  std::string data;       // --data DATA.h5
  std::string split = "test";
  int seq_len = 0;        // --seq-len L (text mode)
  int batch_size = 8;     // --batch-size (data mode)
  bool json = false;
  std::string task;       // --task pubmedqa: yes/no/maybe multiple choice
  std::string qa;         // --qa FILE (records with labels)
  std::string ids;        // --ids FILE: JSON {id: label} / [ids] / lines, or a prepared dataset (its test ids)
  PromptCliOptions prompt;  // not given: the --ids dataset's format, else --prompt-type 1
  std::string answer_field;  // "": the --ids dataset's, else long_answer
  bool allow_trained_ids = false;  // score ids of the model's training split anyway (a warning)
  bool progress = true;   // --no-progress: no progress line on stderr
  Precision precision = Precision::kFp32;  // --precision fp32 | bf16 (config.h)
  DeviceChoice device = DeviceChoice::kAuto;  // --device auto | cpu | cuda | cuda-sim (device.h)
  std::string lora;                // --lora DIR: a PEFT LoRA adapter (peft_adapter.h)
};
CLI::App* setup_eval(CLI::App& root, EvalOptions& opt);
int run_eval(const EvalOptions& opt);

struct GenerateOptions {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  int max_new_tokens = 256;
  float temperature = 1.0f;
  float top_p = 0.9f;
  uint64_t seed = 0;       // 0: from the clock (printed on stderr)
  PromptCliOptions format;  // given: format --question/--context with it instead of --prompt
  std::string question, context;
  Precision precision = Precision::kFp32;  // --precision fp32 | bf16: bf16 rounds the weights (config.h)
  std::string lora;                // --lora DIR: a PEFT LoRA adapter, merged in memory
  DeviceChoice device = DeviceChoice::kAuto;  // where the decoder runs (device.h)
};
CLI::App* setup_generate(CLI::App& root, GenerateOptions& opt);
int run_generate(const GenerateOptions& opt);

struct ConvertOptions {
  std::string input, output;
  std::string to;          // hdf5 | hf | llama2c; empty: from the output path
  std::string merge_lora;  // --merge-lora DIR: a PEFT LoRA adapter merged into the written weights
  std::string tokenizer;   // optional .model to embed in an HDF5 or HF output
  std::string dtype = "fp32";  // fp32 | bf16 (HF output only)
  uint64_t max_shard_size = 5'000'000'000ull;  // --max-shard-size 5GB (HF output)
  bool overwrite = false;  // --overwrite: replace a config.json llamatrain did not write for this model
};
CLI::App* setup_convert(CLI::App& root, ConvertOptions& opt);
int run_convert(const ConvertOptions& opt);

struct PlanCliOptions {
  std::string hostfile;           // --hostfile F (default: this machine as one CPU node)
  std::string model_config;       // --model-config NAME (a preset)
  int n_layers = 0;               // --n-layers: the preset with this many layers (0: its own)
  int seq_len = 0;                // --seq-len (default: the --data file's)
  int64_t global_batch = 0;       // --global-batch B
  int batch_size = 0;             // --batch-size b (micro-batch); 0: the planner picks
  int zero_stage = 1;             // --zero 0|1|2|3
  DType grad_reduce_dtype = DType::kF32;   // --grad-reduce-dtype fp32|bf16
  int zero3_prefetch = 1;                  // --zero3-prefetch 0|1 (GPU ZeRO 3)
  bool offload_optimizer = false;          // --offload-optimizer (GPU ZeRO 1-3)
  Recompute recompute = Recompute::kNone;  // --recompute none|attn|full
  std::string data;               // --data DATA.h5 (its training sequences)
  int64_t tokens = 0;             // --tokens N (training tokens per epoch)
  int np = 0;                     // --np N: the first N slots
  int cpu_cores = 0;              // --cpu-cores: cores of a CPU node
  std::string simulate_slowdown;  // --simulate-slowdown RANK=FACTOR
  std::string calibration;        // --calibration FILE.json
  std::vector<std::string> calibrate;  // --calibrate METRICS.jsonl (repeatable)
  std::string output;             // --output FILE.json (the fitted calibration)
  bool json = false;
  bool allow_unfit = false;       // --allow-unfit: a plan that does not fit exits 0
  LoraConfig lora;                // --lora-rank, --lora-targets (plan.h)
};
CLI::App* setup_plan(CLI::App& root, PlanCliOptions& opt);
int run_plan(const PlanCliOptions& opt);

}  // namespace lt::cli
