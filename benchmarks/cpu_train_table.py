#!/usr/bin/env python3
"""The tables of benchmarks/cpu_train_vs_torch.sh: llamatrain fp32 / bf16 against PyTorch eager
fp32 / bf16 autocast per model, each throughput next to the GEMM rate that bounds it, llamatrain's
step-time breakdown, the ratios against issue 19's targets, and the results JSON.

Runs are given after "--" as "PRESET SYSTEM PRECISION FILE BUSY" strings: SYSTEM llamatrain (FILE:
its --metrics JSONL) or torch (FILE: torch_llama_train.py's --json-out); BUSY: percent of the CPUs
busy with other work just before the run."""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--torch-package", default="unknown")
    p.add_argument("runs", nargs="+")
    return p.parse_args()


def product_flops_per_token(m):
    """6 x the parameters of the matrix products (4 attention projections, 3 FFN, output head)."""
    c, f, l, v = m["dim"], m["hidden_dim"], m["n_layers"], m["vocab_size"]
    kv = c * m["n_kv_heads"] // m["n_heads"]
    return 6.0 * (l * (2 * c * c + 2 * c * kv + 3 * c * f) + v * c)


def llamatrain_run(path, warm):
    recs, devices = [], None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("type") == "step":
                recs.append(r)
            elif r.get("type") == "devices":
                devices = r
    recs.sort(key=lambda r: r["step"])
    if len(recs) <= warm:
        sys.exit(f"{path}: {len(recs)} step records, need more than {warm}")
    timed = recs[warm:]
    ms = statistics.median(r["step_ms"] for r in timed)
    out = {"median_step_ms": ms, "min_step_ms": min(r["step_ms"] for r in timed),
           "losses": [r["loss"] for r in recs], "step_ms": [r["step_ms"] for r in recs],
           "breakdown_ms": {k: statistics.median(r["breakdown_ms"][k] for r in timed)
                            for k in timed[0].get("breakdown_ms", {})}}
    if devices:
        out["gemm_probe_tflops"] = devices["ranks"][0]["gemm_tflops"]
        out["gemm_probe"] = devices["gemm"]
    return out


def torch_run(path, warm):
    with open(path) as f:
        pt = json.load(f)
    pt["min_step_ms"] = min(pt["step_ms"][warm:])
    return pt


def torch_gemm_tflops(m, tokens, dtype):
    """torch.matmul at the model's FFN shape (tokens x dim) @ (dim x hidden), best of 5."""
    a = torch.randn(tokens, m["dim"]).to(dtype)
    b = torch.randn(m["dim"], m["hidden_dim"]).to(dtype)
    torch.matmul(a, b)
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * tokens * m["dim"] * m["hidden_dim"] / best / 1e12


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    tokens = a.batch * a.seq
    results = {}
    for spec in a.runs:
        preset, system, prec, path, busy = spec.split()
        d = llamatrain_run(path, a.warmup) if system == "llamatrain" else torch_run(path, a.warmup)
        d["tokens_per_s"] = tokens / d["median_step_ms"] * 1e3
        d["cpu_busy_percent_before"] = int(busy)
        results.setdefault(preset, {})[f"{system}_{prec}"] = d
    model_of = {}
    for preset, runs in results.items():
        pt = next((r for k, r in runs.items() if k.startswith("torch")), None)
        if pt is None:
            sys.exit(f"{preset}: no PyTorch run to take the model's shape from")
        m = model_of[preset] = pt["model"]
        fpt = product_flops_per_token(m)
        print()
        print(f"{preset}: batch {a.batch} x seq {a.seq}, {a.threads} threads, median after {a.warmup} "
              f"warm-up steps; torch {pt['torch_version']} (Debian python3-torch {a.torch_package})")
        print(f"{'':22s}{'tokens/s':>9s}{'step ms':>9s}{'(min)':>8s}{'1st loss':>9s}{'last':>8s}{'busy%':>6s}"
              f"  products TFLOP/s reached | GEMM bound (TFLOP/s -> tokens/s if products were all)")
        torch_rate = {"fp32": torch_gemm_tflops(m, tokens, torch.float32),
                      "bf16": torch_gemm_tflops(m, tokens, torch.bfloat16)}
        for key in ("llamatrain_fp32", "llamatrain_bf16", "torch_fp32", "torch_bf16"):
            if key not in runs:
                continue
            d = runs[key]
            name = {"llamatrain_fp32": "llamatrain fp32", "llamatrain_bf16": "llamatrain bf16",
                    "torch_fp32": "PyTorch eager fp32", "torch_bf16": "PyTorch bf16 autocast"}[key]
            prec = key.split("_")[1]
            if key.startswith("llamatrain"):
                prod_ms = d["breakdown_ms"].get("products", 0)
                reached = fpt * tokens / (prod_ms / 1e3) / 1e12 if prod_ms > 0 else float("nan")
                bound = d.get("gemm_probe_tflops", float("nan"))
                what = d.get("gemm_probe", "")
            else:
                reached = float("nan")
                bound = torch_rate[prec]
                what = f"torch.matmul {prec} {tokens}x{m['dim']}x{m['hidden_dim']}"
            d["gemm_bound_tflops"], d["gemm_bound"] = bound, what
            d["products_tflops_reached"] = reached
            print(f"{name:22s}{d['tokens_per_s']:9.0f}{d['median_step_ms']:9.1f}{d['min_step_ms']:8.1f}"
                  f"{d['losses'][0]:9.4f}{d['losses'][-1]:8.4f}{d['cpu_busy_percent_before']:6d}"
                  f"  {reached:6.3f} | {bound:6.3f} -> {bound * 1e12 / fpt:7.0f} ({what})")
        for key in ("llamatrain_fp32", "llamatrain_bf16"):
            if key in runs and runs[key]["breakdown_ms"]:
                b = runs[key]["breakdown_ms"]
                print(f"  {key.replace('_', ' ')} step breakdown (median ms): " +
                      ", ".join(f"{k} {v:.1f}" for k, v in b.items()))
        if "llamatrain_bf16" in runs:
            lt = runs["llamatrain_bf16"]["tokens_per_s"]
            for key, goal in (("torch_fp32", 3.0), ("torch_bf16", 2.0)):
                if key in runs:
                    r = lt / runs[key]["tokens_per_s"]
                    runs[f"ratio_llamatrain_bf16_over_{key}"] = r
                    print(f"  llamatrain bf16 / {key.replace('_', ' ')}: {r:.2f}x (target >= {goal:.0f}x: "
                          f"{'met' if r >= goal else 'MISSED'})")
    print("busy%: CPUs busy with other work just before each run (should be ~0; other work skews "
          "the timings)")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
    out = {"benchmark": "cpu_train_vs_torch", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpu": cpu, "nproc": os.cpu_count(), "amx_bf16": " amx_bf16" in flags},
           "threads": a.threads, "batch_size": a.batch, "seq_len": a.seq, "timing_warmup": a.warmup,
           "torch_debian_package": a.torch_package, "models": model_of, "results": results}
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    with open(a.results, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"wrote {a.results}")


if __name__ == "__main__":
    main()
