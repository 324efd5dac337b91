#!/usr/bin/env python3
"""Plot a `llamatrain train --metrics` JSONL file: loss, learning rate and throughput.

Usage: scripts/plot_metrics.py METRICS.jsonl [-o OUT.png] [--title TEXT]

One figure, three panels sharing the optimizer-step axis:
  1. loss: the training loss of every step (`step` records, field `loss`: the mean over the step's
     loss-bearing tokens), and per epoch the mean training loss and the test-split loss (`epoch`
     records, `train_loss` and `test_loss`, drawn at the epoch's last step);
  2. learning rate: `lr` of every step record (the rate the step's update used: warm-up, then
     cosine decay);
  3. tokens/s of every step (`tokens_per_s` = the step's tokens / its wall time, all ranks
     together), and per epoch the epoch's tokens/s (`epoch` records).

A resumed run appends to the same file and may repeat steps; the last record of a step wins.
Records of other types (memory, rebalance, checkpoint, ...) are read and ignored.
A malformed line stops the script with `METRICS.jsonl:LINE: what is wrong` and exit status 1.
Needs matplotlib (Debian: python3-matplotlib, `scripts/install-deps.sh --bench`); exit status 2
when it is missing.
"""
import argparse
import json
import math
import os
import sys


class MetricsError(Exception):
    pass


def _number(rec, name, where, allow_null=False):
    if name not in rec:
        raise MetricsError(f"{where}: no field '{name}'")
    v = rec[name]
    if v is None and allow_null:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MetricsError(f"{where}: field '{name}' is {json.dumps(v)}, expected a number")
    return float(v)


def read_metrics(path):
    """Returns (steps, epochs): steps as {step: (loss, lr, tokens_per_s)} and epochs as a list of
    dicts with step, epoch, train_loss, test_loss (or None), tokens_per_s."""
    steps, epochs = {}, {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise MetricsError(f"{path}: cannot open ({e.strerror})")
    with f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            at = f"{path}:{line_no}"
            try:
                rec = json.loads(line.strip())
            except json.JSONDecodeError as e:
                raise MetricsError(f"{at}: not valid JSON ({e.msg} at column {e.colno})")
            if not isinstance(rec, dict):
                raise MetricsError(f"{at}: not a JSON object")
            kind = rec.get("type")
            if not isinstance(kind, str):
                raise MetricsError(f"{at}: no string field 'type'")
            where = f"{at}: {kind} record"
            if kind == "step":
                step = int(_number(rec, "step", where))
                steps[step] = (_number(rec, "loss", where), _number(rec, "lr", where),
                               _number(rec, "tokens_per_s", where))
            elif kind == "epoch":
                epoch = int(_number(rec, "epoch", where))
                epochs[epoch] = {"epoch": epoch, "step": int(_number(rec, "step", where)),
                                 "train_loss": _number(rec, "train_loss", where),
                                 "test_loss": _number(rec, "test_loss", where, allow_null=True),
                                 "tokens_per_s": _number(rec, "tokens_per_s", where)}
    if not steps:
        raise MetricsError(f"{path}: no step records (expected the --metrics file of a train run)")
    return steps, [epochs[e] for e in sorted(epochs)]


def plot(steps, epochs, out_png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = sorted(steps)
    loss = [steps[s][0] for s in xs]
    lr = [steps[s][1] for s in xs]
    tps = [steps[s][2] for s in xs]
    fig, (ax_loss, ax_lr, ax_tps) = plt.subplots(3, 1, sharex=True, figsize=(8, 8.5))

    ax_loss.plot(xs, loss, color="#1f77b4", lw=1, label="train (per step)")
    if epochs:
        ax_loss.plot([e["step"] for e in epochs], [e["train_loss"] for e in epochs], "s", color="#1f77b4",
                     mfc="white", label="train (epoch mean)")
        test = [(e["step"], e["test_loss"]) for e in epochs if e["test_loss"] is not None]
        if test:
            ax_loss.plot(*zip(*test), "o-", color="#d62728", label="test (per epoch)")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)

    ax_lr.plot(xs, lr, color="#2ca02c", lw=1.2)
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax_lr.grid(alpha=0.3)

    ax_tps.plot(xs, tps, color="#7f7f7f", lw=0.8, marker=".", ms=3, label="per step")
    if epochs:
        # The epoch's figure as a level line over the epoch's steps.
        prev = 0
        for i, e in enumerate(epochs):
            ax_tps.hlines(e["tokens_per_s"], prev + 1, e["step"], color="#ff7f0e", lw=2,
                          label="per epoch" if i == 0 else None)
            prev = e["step"]
    ax_tps.set_ylabel("tokens/s")
    ax_tps.set_xlabel("optimizer step")
    ax_tps.set_ylim(bottom=0)
    ax_tps.legend(fontsize=8)
    ax_tps.grid(alpha=0.3)

    finite = [v for v in loss if math.isfinite(v)]
    summary = f"{len(xs)} steps, {len(epochs)} epoch(s)"
    if finite:
        summary += f", loss {loss[0]:.3f} -> {loss[-1]:.3f}"
    fig.suptitle(f"{title}\n{summary}" if title else summary, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot loss, learning rate and tokens/s from a train --metrics JSONL file")
    ap.add_argument("metrics", help="JSONL written by `llamatrain train --metrics`")
    ap.add_argument("-o", "--output", help="PNG to write (default: METRICS with .png instead of .jsonl)")
    ap.add_argument("--title", default=None, help="figure title (default: the metrics file's name)")
    a = ap.parse_args(argv)
    out = a.output or (a.metrics[:-6] if a.metrics.endswith(".jsonl") else a.metrics) + ".png"
    try:
        steps, epochs = read_metrics(a.metrics)
    except MetricsError as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"plot_metrics: {sys.executable} has no matplotlib (Debian: apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 2
    plot(steps, epochs, out, a.title if a.title is not None else os.path.basename(a.metrics))
    print(f"plot_metrics: wrote {out} ({len(steps)} steps, {len(epochs)} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
