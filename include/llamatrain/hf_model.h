// The Hugging Face layout of a Llama model (what transformers' LlamaForCausalLM saves):
//
//   <dir>/config.json                   hidden_size, intermediate_size, num_hidden_layers, ...
//   <dir>/model.safetensors             one file, or
//   <dir>/model-00001-of-0000N.safetensors ... + model.safetensors.index.json ("weight_map":
//                                       tensor name -> shard file name)
//   <dir>/tokenizer.model               SentencePiece model (optional), and beside it
//   <dir>/tokenizer_config.json         LlamaTokenizer's settings: BOS added, EOS not
//   <dir>/special_tokens_map.json       the BOS/EOS/UNK pieces of the SentencePiece model
//
// A single `.safetensors` file with config.json beside it is accepted too. Tensor names:
//   model.embed_tokens.weight                       tok_embeddings
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight  wq wk wv wo   (q and k permuted, see below)
//   model.layers.N.mlp.{gate,up,down}_proj.weight   w1 w3 w2
//   model.layers.N.input_layernorm.weight           attention_norm
//   model.layers.N.post_attention_layernorm.weight  ffn_norm
//   model.norm.weight, lm_head.weight (absent when tie_word_embeddings)
//
// RoPE: Meta's code rotates adjacent pairs (2i, 2i+1) of each head; HF's rotates halves (i,
// i + head_dim/2). HF's convert_llama_weights_to_hf.py therefore stores wq (over n_heads) and wk
// (over n_kv_heads) with each head's rows reordered: the even rows first, then the odd rows,
//   HF row  h*hd + p*hd/2 + i  =  Meta row  h*hd + 2i + p      (p in {0, 1}, i < hd/2),
// which makes both models compute the same function. Import applies the inverse.
#pragma once
#include <cstdint>
#include <string>

#include "llamatrain/model_io.h"

namespace lt {

// The files of the layout.
constexpr const char* kHfConfigFile = "config.json";
constexpr const char* kHfSingleFile = "model.safetensors";
constexpr const char* kHfIndexFile = "model.safetensors.index.json";
constexpr const char* kHfTokenizerFile = "tokenizer.model";
constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";
constexpr const char* kHfSpecialTokensFile = "special_tokens_map.json";
// llama2.c's RoPE tables (ModelData::extras) travel in the safetensors __metadata__ under this
// prefix, base64 of little-endian fp32, so llama2.c -> HF -> llama2.c stays byte-identical while
// every other reader of the files ignores them (metadata is plain strings, not tensors).
constexpr const char* kHfExtraMetadataPrefix = "llamatrain.extra.";

// A directory with config.json, or a file whose content is a safetensors header (by content, so
// a renamed file is still recognised). Cheap: reads at most 9 bytes.
bool is_hf_model(const std::string& path);
// The directory that holds config.json for an HF model path (the path itself or its parent).
std::string hf_model_dir(const std::string& path);

// config.json <-> Llama2Config. `origin` names the file in errors; unsupported variants
// (rope_scaling, attention biases, another architecture) are refused with the field named.
Llama2Config hf_config_from_json(const std::string& text, const std::string& origin);
std::string hf_config_to_json(const Llama2Config& config, bool bf16);

// The JSON files transformers' AutoTokenizer reads beside tokenizer.model, for the SentencePiece
// model `sp_model` (serialized; `origin` names it in errors, which a model that does not load
// raises): LlamaTokenizer adding BOS and not EOS, as llamatrain encodes prompts and documents
// (Tokenizer::encode(text, true, false)), its special tokens the model's own pieces.
struct HfTokenizerFiles {
  std::string config;              // tokenizer_config.json
  std::string special_tokens_map;  // special_tokens_map.json
};
HfTokenizerFiles hf_tokenizer_files(const std::string& sp_model, const std::string& origin, int model_max_length);

// The q/k row permutation for one weight of n_heads heads of head_dim rows, each row_len long.
void hf_permute_from_meta(float* hf, const float* meta, int n_heads, int head_dim, int row_len);
void hf_permute_to_meta(float* meta, const float* hf, int n_heads, int head_dim, int row_len);

// model_io.h's load_model/read_model_config/save_model_hf delegate here.
ModelData load_model_hf(const std::string& path);
Llama2Config read_model_config_hf(const std::string& path);

}  // namespace lt
