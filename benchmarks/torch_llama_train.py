#!/usr/bin/env python3
"""Eager PyTorch Llama 2 training loop: the CPU baseline llamatrain is measured against.

Written for this benchmark (not copied from HF or Meta code). Same semantics as llamatrain
(DESIGN.md "Llama 2 semantics"):
  * RMSNorm y = x / sqrt(mean(x^2) + eps) * w, eps 1e-5
  * RoPE base 10000 rotating adjacent pairs (i, i+1) within each head (Meta layout)
  * causal attention, GQA: head h uses KV head h // (n_heads / n_kv_heads)
  * SwiGLU FFN w2(silu(w1 x) * w3 x), no biases anywhere
  * output head tied to the token embedding (llama2.c stories15M "shared classifier")
  * loss: cross-entropy summed over target tokens with mask 1, divided by their count
  * AdamW (decoupled weight decay on matrices only, not on norm weights), global-norm clip

One timed step = batch + zero_grad + forward + backward + clip + optimizer step, timed with
time.perf_counter. Reported: the loss of every step, the median step time over the steps after
the warm-up steps, and tokens/s = batch * seq_len / median.

Usage (stories15m shape, random tokens):
  /usr/bin/python3 benchmarks/torch_llama_train.py --threads 2 --steps 5
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Model shape: defaults are llamatrain's `stories15m` preset (llama2.c stories15M).
    p.add_argument("--dim", type=int, default=288)
    p.add_argument("--hidden-dim", type=int, default=768)
    p.add_argument("--n-layers", type=int, default=6)
    p.add_argument("--n-heads", type=int, default=6)
    p.add_argument("--n-kv-heads", type=int, default=6)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    # Training.
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timing-warmup", type=int, default=3,
                   help="first steps left out of the timing median")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clip; 0 disables")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=None,
                   help="llamatrain dataset (HDF5): rows of /train/tokens and /train/loss_mask")
    p.add_argument("--json-out", default=None, help="write the results here")
    p.add_argument("--autocast-bf16", action="store_true",
                   help="forward and loss under torch.autocast('cpu', bfloat16): bf16 matmuls (oneDNN), "
                        "fp32 master weights and optimizer")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # x: (B, T, C)
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * rstd * self.weight


def rope_tables(head_dim, seq_len, theta):
    """cos/sin of angle t * theta^(-2i/head_dim) for pair i = 0 .. head_dim/2-1: (T, head_dim/2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def rope_apply(x, cos, sin):
    """Rotate adjacent pairs (x[2i], x[2i+1]) by the position's angle (Meta layout).

    x: (B, T, H, head_dim); cos, sin: (T, head_dim/2).
    """
    x0 = x[..., 0::2]  # (B, T, H, head_dim/2)
    x1 = x[..., 1::2]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    y0 = x0 * c - x1 * s
    y1 = x0 * s + x1 * c
    return torch.stack((y0, y1), dim=-1).flatten(-2)


# F.scaled_dot_product_attention appeared in torch 2.0. Where it exists we use it (is_causal=True),
# otherwise (Debian bookworm's torch 1.13) the explicit masked softmax below.
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
ATTENTION_IMPL = "F.scaled_dot_product_attention(is_causal=True)" if HAVE_SDPA else \
    "explicit masked softmax (q k^T / sqrt(d), -inf above the diagonal, softmax, @ v)"


def causal_attention(q, k, v, causal_mask):
    """q, k, v: (B, H, T, head_dim) -> (B, H, T, head_dim)."""
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, T, T)
    scores = scores.masked_fill(causal_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_heads = a.n_heads
        self.n_kv_heads = a.n_kv_heads
        self.head_dim = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x, cos, sin, causal_mask):  # x: (B, T, C)
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q = rope_apply(q, cos, sin)
        k = rope_apply(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:  # GQA: head h reads KV head h // rep
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             causal_mask)  # (B, H, T, head_dim)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.w2 = nn.Linear(a.hidden_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a)

    def forward(self, x, cos, sin, causal_mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, causal_mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama2(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied classifier
        cos, sin = rope_tables(a.dim // a.n_heads, a.seq_len, a.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        mask = torch.ones(a.seq_len, a.seq_len, dtype=torch.bool).triu(1)  # True = masked
        self.register_buffer("causal_mask", mask, persistent=False)
        # llama2.c's initialisation: N(0, 0.02) everywhere, residual projections (wo, w2)
        # scaled by 1/sqrt(2 n_layers) (GPT-2 convention); norm weights 1.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("wo.weight") or name.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * a.n_layers)
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens):  # tokens: (B, T) int64 -> logits (B, T, V)
        T = tokens.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        mask = self.causal_mask[:T, :T]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output(self.norm(x))


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

class Batches:
    """Rows in file order, as `llamatrain train --no-shuffle`: an epoch is n_seq // B steps (the
    remainder is dropped) and step s uses rows (s mod steps_per_epoch) * B + i, i < B."""

    def __init__(self, a):
        self.batch_size = a.batch_size
        if a.data:
            import h5py
            with h5py.File(a.data, "r") as f:
                tokens = torch.from_numpy(f["/train/tokens"][...].astype("int64"))
                mask = torch.from_numpy(f["/train/loss_mask"][...].astype("bool"))
            if tokens.dim() != 2 or tokens.shape != mask.shape or tokens.shape[0] == 0:
                sys.exit(f"{a.data}: /train/tokens {tuple(tokens.shape)} and /train/loss_mask "
                         f"{tuple(mask.shape)} must be equal non-empty (n_seq, seq_len+1)")
            if tokens.shape[1] != a.seq_len + 1:
                sys.exit(f"{a.data}: /train/tokens has {tokens.shape[1]} columns, expected "
                         f"seq_len+1 = {a.seq_len + 1}")
            if int(tokens.max()) >= a.vocab_size or int(tokens.min()) < 0:
                sys.exit(f"{a.data}: token ids outside [0, {a.vocab_size})")
            self.source = f"{a.data} ({tokens.shape[0]} rows)"
        else:
            g = torch.Generator().manual_seed(a.seed)
            n = a.batch_size * a.steps
            tokens = torch.randint(0, a.vocab_size, (n, a.seq_len + 1), generator=g)
            mask = torch.ones_like(tokens, dtype=torch.bool)
            mask[:, 0] = False  # column 0 is never a target
            self.source = f"random tokens, seed {a.seed}"
        if tokens.shape[0] < a.batch_size:
            sys.exit(f"{self.source}: fewer rows than one batch ({a.batch_size})")
        self.tokens, self.mask = tokens, mask
        self.steps_per_epoch = tokens.shape[0] // a.batch_size

    def get(self, step):
        first = (step % self.steps_per_epoch) * self.batch_size
        rows = torch.arange(first, first + self.batch_size)
        t, m = self.tokens[rows], self.mask[rows]
        inputs = t[:, :-1].contiguous()
        targets = t[:, 1:].masked_fill(~m[:, 1:], -100).contiguous()  # -100: ignored
        return inputs, targets, int(m[:, 1:].sum())


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def make_optimizer(model, a):
    # Weight decay on matrices only (embedding/classifier and all projections), not norm weights.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps)
    # The multi-tensor (foreach) implementation is PyTorch's fastest AdamW on CPU in 1.13/2.x.
    try:
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "AdamW(foreach=True)"
    except TypeError:
        return torch.optim.AdamW(groups, **kwargs), "AdamW"


def flops_per_token(a, n_params):
    """6N + 12 L C T (PaLM convention, same as Llama2Config::flops_per_token; tied head once)."""
    return 6.0 * n_params + 12.0 * a.n_layers * a.dim * a.seq_len


def main(argv=None):
    a = parse_args(argv)
    if a.dim % a.n_heads or a.n_heads % a.n_kv_heads or (a.dim // a.n_heads) % 2:
        sys.exit("need dim % n_heads == 0, n_heads % n_kv_heads == 0 and an even head_dim")
    if a.steps <= a.timing_warmup:
        sys.exit(f"--steps ({a.steps}) must exceed --timing-warmup ({a.timing_warmup})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    model = Llama2(a)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied weight counted once
    opt, opt_name = make_optimizer(model, a)
    data = Batches(a)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, params {n_params:,}, "
          f"batch {a.batch_size} x seq {a.seq_len}", flush=True)
    print(f"attention: {ATTENTION_IMPL}; optimizer: {opt_name}; data: {data.source}; "
          f"{'bf16 autocast' if a.autocast_bf16 else 'fp32'}", flush=True)

    losses, step_ms, grad_norms = [], [], []
    for step in range(a.steps):
        # The timed step includes picking the batch, as llamatrain's step_ms does.
        t0 = time.perf_counter()
        inputs, targets, n_loss_tokens = data.get(step)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            logits = model(inputs)  # (B, T, V)
            loss_sum = F.cross_entropy(logits.view(-1, a.vocab_size).float(), targets.view(-1),
                                       ignore_index=-100, reduction="sum")
        loss = loss_sum / max(n_loss_tokens, 1)
        loss.backward()
        if a.grad_clip > 0:
            gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip))
        else:
            gnorm = float(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        opt.step()
        dt = (time.perf_counter() - t0) * 1e3
        losses.append(float(loss))
        step_ms.append(dt)
        grad_norms.append(gnorm)
        print(f"step {step + 1:4d}/{a.steps}  loss {losses[-1]:.4f}  grad_norm {gnorm:.4f}  "
              f"{dt:8.1f} ms  {a.batch_size * a.seq_len / dt * 1e3:8.0f} tok/s", flush=True)

    timed = step_ms[a.timing_warmup:]
    median_ms = statistics.median(timed)
    tokens_per_s = a.batch_size * a.seq_len / median_ms * 1e3
    fpt = flops_per_token(a, n_params)
    gflops = fpt * tokens_per_s / 1e9
    print(f"median step {median_ms:.1f} ms over {len(timed)} steps (after {a.timing_warmup} "
          f"warm-up), {tokens_per_s:.0f} tokens/s, {gflops:.1f} GFLOP/s (6N + 12LCT)", flush=True)

    if a.json_out:
        result = {
            "benchmark": "torch_llama_train",
            "torch_version": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "attention": ATTENTION_IMPL,
            "autocast_bf16": a.autocast_bf16,
            "optimizer": opt_name,
            "data": data.source,
            "model": {k: getattr(a, k) for k in ("dim", "hidden_dim", "n_layers", "n_heads",
                                                 "n_kv_heads", "vocab_size", "seq_len",
                                                 "norm_eps", "rope_theta")},
            "tied_embeddings": True,
            "n_params": n_params,
            "train": {k: getattr(a, k) for k in ("batch_size", "steps", "timing_warmup", "lr",
                                                 "beta1", "beta2", "adam_eps", "weight_decay",
                                                 "grad_clip", "seed")},
            "losses": losses,
            "grad_norms": grad_norms,
            "step_ms": step_ms,
            "median_step_ms": median_ms,
            "tokens_per_s": tokens_per_s,
            "flops_per_token": fpt,
            "gflops_per_s": gflops,
        }
        d = os.path.dirname(os.path.abspath(a.json_out))
        os.makedirs(d, exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
