#!/usr/bin/env python3
"""Correctness check for the PyTorch baseline (torch_llama_train.py) before it is timed.

Loads the real pretrained llama2.c model ../shared/data/stories260K.bin (dim 64, 5 layers,
8 heads, 4 KV heads: exercises GQA, tied classifier) into torch_llama_train.Llama2 and measures
its next-token loss on TinyStories text tokenised with tok512.model. A model with the right
semantics (Meta-layout RoPE, GQA head -> KV head h // rep, RMSNorm, SwiGLU) predicts this text
well; the same weights with RoPE on the wrong layout (rotate-half) must do clearly worse, which
shows the check can fail. Also prints a greedy continuation of "Once upon a time".

Exit status: 0 pass, 1 fail, 2 reference data absent (skipped, message says why).
Usage: /usr/bin/python3 benchmarks/check_torch_llama.py [--data-dir ../shared/data]
"""
import argparse
import os
import struct
import sys
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama_train as tlt  # noqa: E402

# Thresholds (nats/token on the first ~1500 characters of tinystories_sample.txt).
kMaxLoss = 2.5       # the pretrained model with the right semantics stays below this
kMinMargin = 1.0     # the wrong RoPE layout must be at least this much worse


# --- SentencePiece model proto: just the pieces and scores (no dependency on sentencepiece) ---

def _varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def _fields(b):
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        f, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        yield f, v


def load_pieces(path):
    """ModelProto field 1 = repeated SentencePiece {1: piece, 2: score (float)}."""
    pieces, scores = [], []
    for f, v in _fields(open(path, "rb").read()):
        if f == 1:
            d = dict(_fields(v))
            pieces.append(d[1].decode("utf-8"))
            scores.append(struct.unpack("<f", d[2])[0] if 2 in d else 0.0)
    return pieces, scores


def encode(text, pieces, scores):
    """llama2.c run.c encode(): BOS, dummy prefix, codepoints (byte fallback id = byte + 3),
    then repeatedly merge the adjacent pair whose merge has the highest score (leftmost on ties)."""
    vocab = {p: i for i, p in enumerate(pieces)}
    ids = [1, vocab["\u2581"]]
    for ch in text.replace(" ", "\u2581"):
        if ch in vocab:
            ids.append(vocab[ch])
        else:
            ids.extend(b + 3 for b in ch.encode("utf-8"))
    while True:
        best, best_i = None, -1
        for i in range(1, len(ids) - 1):  # never merge BOS
            j = vocab.get(pieces[ids[i]] + pieces[ids[i + 1]])
            if j is not None and (best is None or scores[j] > scores[best]):
                best, best_i = j, i
        if best is None:
            return ids
        ids[best_i:best_i + 2] = [best]


def decode(ids, pieces):
    return "".join(pieces[i] for i in ids).replace("\u2581", " ")


# --- llama2.c v0 checkpoint (../LLAMA2C_BIN_FORMAT.md) ---

def load_llama2c(path):
    raw = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", raw[:28])
    a = types.SimpleNamespace(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=n_heads,
                              n_kv_heads=n_kv, vocab_size=abs(vocab), seq_len=seq_len,
                              norm_eps=1e-5, rope_theta=10000.0)
    w = torch.frombuffer(bytearray(raw[28:]), dtype=torch.float32)
    off = 0

    def take(*shape):
        nonlocal off
        n = 1
        for s in shape:
            n *= s
        t = w[off:off + n].view(*shape)
        off += n
        return t

    kv_dim = n_kv * (dim // n_heads)
    V, L = abs(vocab), n_layers
    model = tlt.Llama2(a)
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(take(V, dim))
        for name, shape in (("attention_norm.weight", (dim,)), ("attention.wq.weight", (dim, dim)),
                            ("attention.wk.weight", (kv_dim, dim)),
                            ("attention.wv.weight", (kv_dim, dim)),
                            ("attention.wo.weight", (dim, dim)), ("ffn_norm.weight", (dim,)),
                            ("feed_forward.w1.weight", (hidden, dim)),
                            ("feed_forward.w2.weight", (dim, hidden)),
                            ("feed_forward.w3.weight", (hidden, dim))):
            all_layers = take(L, *shape)
            for l in range(L):
                model.layers[l].get_parameter(name).copy_(all_layers[l])
        model.norm.weight.copy_(take(dim))
        off += 2 * seq_len * (dim // n_heads // 2)  # legacy freq_cis tables, unused
        if vocab < 0:
            model.output.weight = torch.nn.Parameter(take(V, dim).clone())
    if off != w.numel():
        raise ValueError(f"{path}: {w.numel() - off} floats left after the last tensor")
    return model, a


def rope_rotate_half(x, cos, sin):
    """The WRONG layout for llama2.c weights (HF rotate-half): pairs (i, i + head_dim/2)."""
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


def mean_loss(model, ids):
    x = torch.tensor(ids[:-1])[None]
    y = torch.tensor(ids[1:])[None]
    with torch.no_grad():
        return float(F.cross_entropy(model(x)[0], y[0]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--data-dir", default=os.path.join(here, "..", "..", "shared", "data"))
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    paths = [os.path.join(a.data_dir, f) for f in
             ("stories260K.bin", "tok512.model", "tinystories_sample.txt")]
    missing = [f for f in paths if not os.path.isfile(f)]
    if missing:
        print(f"SKIP: reference data absent: {', '.join(missing)}")
        return 2

    pieces, scores = load_pieces(paths[1])
    prompt = encode("Once upon a time", pieces, scores)
    if prompt != [1, 403, 407, 261, 378]:
        print(f"FAIL: tokeniser: 'Once upon a time' -> {prompt}, expected [1, 403, 407, 261, 378]")
        return 1
    model, cfg = load_llama2c(paths[0])
    model.eval()
    text = open(paths[2], encoding="utf-8").read()[:1500]
    ids = encode(text, pieces, scores)[:cfg.seq_len]

    ok_loss = mean_loss(model, ids)
    right_rope = tlt.rope_apply
    tlt.rope_apply = rope_rotate_half
    try:
        bad_loss = mean_loss(model, ids)
    finally:
        tlt.rope_apply = right_rope

    out = list(prompt)
    with torch.no_grad():
        for _ in range(40):
            out.append(int(model(torch.tensor(out)[None])[0, -1].argmax()))
    print(f"greedy: {decode(out[1:], pieces)!r}")
    print(f"loss over {len(ids) - 1} tokens: {ok_loss:.3f} (limit {kMaxLoss}); with rotate-half "
          f"RoPE {bad_loss:.3f} (must be >= {ok_loss + kMinMargin:.3f}); ln(V) = "
          f"{torch.log(torch.tensor(float(cfg.vocab_size))):.3f}")
    if ok_loss > kMaxLoss or bad_loss < ok_loss + kMinMargin:
        print("FAIL")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
