#!/usr/bin/env python3
"""LoRA against Hugging Face PEFT (issue 36, point 5): the same Llama with the same adapters in
llamatrain and in transformers + PEFT (float64, the reference) give the same loss, logits and
adapter gradients, each within 1e-5 relative.

  peft_adapter  PEFT makes an adapter (get_peft_model with init_lora_weights=False, so A and B are
                both random, r 4, alpha 8, all seven projections) on llamatrain's HF export of the
                base and saves it; llamatrain reads that directory (read_peft_adapter) and runs it
                unmerged (lt_lora_forward: loss, logits and the adapters' gradients of a random
                batch with a partial loss mask); PEFT computes the same in float64.
  trained       an adapter llamatrain trained (train --lora-rank, its DIR/adapter) loaded by PEFT
                (PeftModel.from_pretrained) onto the HF export of the base: the same logits.
Bases: a `tiny` Llama 2 trained 20 steps on the built-in tales (GQA, untied head) and, where
../shared/data has it, stories260K (tied head, head_dim 8).

Usage: test_lora_peft.py LLAMATRAIN LT_LORA_FORWARD SHARED_DATA_DIR
Exit status: 0 pass, 1 fail, 77 skipped (torch, transformers, peft or safetensors missing), with
the reason printed. pip install torch transformers peft safetensors
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
TOL = 1e-5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"]

for mod in ("torch", "transformers", "peft", "safetensors"):
    if importlib.util.find_spec(mod) is None:
        print(f"skipped: python module {mod} is not installed ({sys.executable}); "
              "pip install torch transformers peft safetensors")
        sys.exit(SKIP)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

failures = []


def run(*cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr}")
    return r


def check(what, value, limit=TOL):
    ok = value <= limit
    print(f"{'ok  ' if ok else 'FAIL'} {what}: {value:.3g} (limit {limit:g})")
    if not ok:
        failures.append(what)


def hf_model(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float64, attn_implementation="eager")


def reference(model, batch, want_grads):
    """Loss (summed masked cross-entropy), logits and the adapters' gradients by PEFT's name."""
    B, T = batch["B"], batch["T"]
    inputs = torch.tensor(batch["inputs"]).view(B, T)
    targets = torch.tensor(batch["targets"]).view(-1)
    mask = torch.tensor(batch["mask"], dtype=torch.float64).view(-1)
    logits = model(input_ids=inputs).logits
    V = logits.shape[-1]
    loss = (F.cross_entropy(logits.view(-1, V), targets, reduction="none") * mask).sum()
    grads = {}
    if want_grads:
        loss.backward()
        for name, p in model.named_parameters():
            if "lora_" in name:
                grads[name.replace(".default", "")] = p.grad.detach()
    return loss.item(), logits.detach().reshape(-1), grads


def compare(label, lt_dir, loss, logits, grads):
    res = json.load(open(os.path.join(lt_dir, "result.json")))
    lt_logits = torch.tensor(res["logits"], dtype=torch.float64)
    check(f"{label}: loss {res['loss_sum']:.9g} vs {loss:.9g}, relative", abs(res["loss_sum"] - loss) / abs(loss))
    check(f"{label}: logits, worst |difference| / max |logit|",
          (lt_logits - logits).abs().max().item() / logits.abs().max().item())
    if not grads:
        return
    lt_grads = load_file(os.path.join(lt_dir, "grads", "adapter_model.safetensors"))
    if set(lt_grads) != set(grads):
        failures.append(f"{label}: gradient names differ: {sorted(set(lt_grads) ^ set(grads))[:4]}")
        return
    worst, worst_name = 0.0, ""
    for name, g in grads.items():
        d = (lt_grads[name].double() - g).norm().item() / max(g.norm().item(), 1e-30)
        if d > worst:
            worst, worst_name = d, name
    check(f"{label}: {len(grads)} adapter gradients, worst relative L2 ({worst_name})", worst)


def case(label, lt, forward, model_h5, work, seed):
    hf_dir = os.path.join(work, label + "-hf")
    run(lt, "convert", "--input", model_h5, "--output", hf_dir)
    # 1. PEFT's adapter in llamatrain.
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS,
                                                 init_lora_weights=False, task_type="CAUSAL_LM"))
    adapter = os.path.join(work, label + "-peft-adapter")
    peft_model.save_pretrained(adapter)
    out = os.path.join(work, label + "-lt")
    run(forward, model_h5, adapter, seed, out)
    ref = PeftModel.from_pretrained(hf_model(hf_dir), adapter, is_trainable=True).double()
    compare(label + ", PEFT's adapter", out, *reference(ref, json.load(open(os.path.join(out, "batch.json"))), True))
    return hf_dir


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    lt, forward, shared = sys.argv[1:]
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "tales.h5")
        run(lt, "prepare", "--text", "builtin:tinytales", "--vocab-size", "512", "--seq-len", "32",
            "--test-split", "0.05", "--seed", "1", "--output", data)
        run(lt, "train", "--model-config", "tiny", "--data", data, "--max-steps", "20", "--lr", "3e-3", "--seed", "3",
            "--no-progress", "--output", os.path.join(work, "base"))
        tiny = os.path.join(work, "base", "model.h5")
        tiny_hf = case("tiny", lt, forward, tiny, work, 11)
        # 2. llamatrain's trained adapter in PEFT.
        run(lt, "train", "--init-from", tiny, "--data", data, "--max-steps", "6", "--lr", "1e-2", "--seed", "4",
            "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "wq,wk,wv,wo,w1,w2,w3", "--no-progress",
            "--output", os.path.join(work, "lora"))
        trained = os.path.join(work, "lora", "adapter")
        out = os.path.join(work, "trained-lt")
        run(forward, tiny, trained, 12, out)
        ref = PeftModel.from_pretrained(hf_model(tiny_hf), trained).double()
        compare("tiny, llamatrain's trained adapter", out, *reference(ref, json.load(open(os.path.join(out, "batch.json"))), False))
        s260 = os.path.join(shared, "stories260K.bin")
        if os.path.exists(s260):
            h5 = os.path.join(work, "s260.h5")
            run(lt, "convert", "--input", s260, "--output", h5, "--tokenizer", os.path.join(shared, "tok512.model"))
            case("stories260K", lt, forward, h5, work, 13)
        else:
            print(f"note: {s260} absent: stories260K not checked")
    if failures:
        print(f"{len(failures)} check(s) failed: {failures}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
