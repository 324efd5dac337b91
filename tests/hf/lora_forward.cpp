// llamatrain's side of tests/hf/test_lora_peft.py: a model (any format load_model reads) with a PEFT
// LoRA adapter applied unmerged (read_peft_adapter, the fp32 training model's passes), on a batch of
// B x T random tokens with a partial loss mask drawn from SEED: writes OUT/batch.json (inputs,
// targets, mask), OUT/result.json (the summed masked loss and the logits, B*T*V) and OUT/grads/, the
// adapters' gradients of the summed loss in PEFT's adapter format (written by write_peft_adapter,
// so B's rows of q_proj and k_proj are in the HF export's order, as B's are).
// Usage: lt_lora_forward MODEL ADAPTER_DIR SEED OUT_DIR
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/model.h"
#include "llamatrain/model_io.h"
#include "llamatrain/peft_adapter.h"
#include "llamatrain/rng.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL ADAPTER_DIR SEED OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::string out = argv[4];
    lt::ModelData md = lt::load_model(argv[1]);
    lt::Llama2Model model(md.config);
    model.params() = std::move(md.params);
    lt::PeftAdapter adapter = lt::read_peft_adapter(argv[2], md.config);
    model.enable_lora(adapter.config, 0);
    model.lora_params() = adapter.params;
    const int B = 2, T = 16, V = md.config.vocab_size;
    lt::Rng rng(std::stoull(argv[3]));
    std::vector<int32_t> inputs, targets;
    std::vector<uint8_t> mask;
    for (int i = 0; i < B * T; ++i) {
      inputs.push_back(int32_t(rng.below(uint64_t(V))));
      targets.push_back(int32_t(rng.below(uint64_t(V))));
      mask.push_back(i % 5 == 2 ? 0 : 1);
    }
    lt::Batch b;
    b.B = B, b.T = T, b.inputs = inputs.data(), b.targets = targets.data(), b.loss_mask = mask.data();
    const double loss = model.forward(b);
    const float* logits = model.logits();
    const std::vector<float> kept(logits, logits + size_t(B) * T * V);
    model.clear_grads();
    model.backward(b, 1.f);
    lt::make_dirs(out);
    lt::write_file_atomic(out + "/batch.json",
                          nlohmann::json({{"B", B}, {"T", T}, {"inputs", inputs}, {"targets", targets}, {"mask", mask}})
                              .dump());
    lt::write_file_atomic(out + "/result.json", nlohmann::json({{"loss_sum", loss}, {"logits", kept}}).dump());
    lt::write_peft_adapter(out + "/grads", md.config, *model.lora(), model.lora_grads().data(), "gradients");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lt_lora_forward: %s\n", e.what());
    return 1;
  }
  return 0;
}
