#!/usr/bin/env python3
"""Epoch time over a grid of configurations, measured and planned.

One short epoch of a fixed small job (the `tiny` model on builtin:factqa, prompt layout 3, vocab 512,
seq 128: 1850 training rows) per configuration of the grid

    ranks x micro-batch x ZeRO stage x balance x recompute x slowdown

each run REPEATS times (round the whole grid, so that a slow spell of the machine falls on every
configuration alike); the CSV keeps the median epoch time (training steps only, as the trainer's
`epoch_time_s`; the test-split evaluation is excluded), its min and max, and the median tokens/s.
Beside each measurement stands `llamatrain plan`'s prediction for the same configuration, from ONE
calibration made before the sweep (`plan --calibrate` on a CAL_STEPS-step run per rank count, at the
grid's first micro-batch, ZeRO 1 (or the grid's first stage), equal batches, no slowdown).

Axes (options, or the environment variable in brackets; options win):
  --ranks 1,2 (RANKS)            mpirun -np values
  --micro-batch 4,8 (MICRO_BATCH) train --batch-size values
  --zero 0,1,2 (ZERO)            ZeRO stages
  --balance off,auto (BALANCE)   off, static or auto; static takes --rank-weights that match the
                                 slowdown (the slow rank 1/FACTOR), i.e. the balanced split from step 1
  --recompute none (RECOMPUTE)   none, attn or full (train --recompute). With a `train` that has no
                                 --recompute option (older builds) only `none` can run: other values
                                 get a row with the planner's prediction and no measurement (status
                                 "not run"), never an invented time.
  --slowdown none (SLOWDOWN)     none or RANK=FACTOR, comma-separated, e.g. none,1=2: rank RANK
                                 computes FACTOR times slower (SIMULATED: it busy-waits, see train
                                 --simulate-slowdown). Configurations whose RANK does not exist are left out.
With one rank, ZeRO stages and balance modes do nothing (one shard, one split), so for -np 1 the
grid keeps only its first ZeRO stage and balance `off`.
Other options: --global-batch 32 (GLOBAL_BATCH; sequences per step, a multiple of every micro-batch),
  --repeats 3 (REPEATS), --cal-steps 30 (CAL_STEPS), --data FILE (DATA; a dataset made by `prepare`
  instead of builtin:factqa), --build-dir build (BUILD_DIR),
  --work DIR (WORK, default BUILD_DIR/bench/sweep: dataset, metrics and logs of every run),
  --results PREFIX (RESULTS, default benchmarks/results/sweep: PREFIX.csv, PREFIX_runs.csv,
  PREFIX_epoch.png, PREFIX_tokens.png), --dry-run (print the grid and the commands, run nothing).
Charts need matplotlib (Debian python3-matplotlib; run with /usr/bin/python3); without it only the
CSVs are written. Launch: mpirun --oversubscribe --bind-to none (and --allow-run-as-root as root).
Threads per rank: llamatrain's default (cores / ranks on the node); OMP_NUM_THREADS is unset.
Exit status: 0 done, 2 a prerequisite or an option is wrong, 1 a run failed (its log is named).
"""
import argparse
import csv
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The job (as benchmarks/epoch_sweep.sh, except the global batch, which is an option here).
MODEL = "tiny"
SEQ_LEN = 128
TRAIN_FLAGS = ["--model-config", MODEL, "--lr", "1e-3", "--warmup-steps", "10", "--seed", "1",
               "--no-progress"]
# The trainer's first --balance auto decision comes after step 5 (four measured steps; the first is
# skipped) and is taken when it predicts a step more than 3% faster (src/train/trainer.cpp).
AUTO_FIRST_DECISION_STEP = 5
AUTO_MIN_GAIN = 0.03


def die(msg, code=2):
    print(f"sweep: {msg}", file=sys.stderr)
    sys.exit(code)


def env_or(name, default):
    return os.environ.get(name, default)


def parse_list(text, name, kind=str):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        die(f"--{name}: empty list")
    try:
        return [kind(t) for t in items]
    except ValueError:
        die(f"--{name}: '{text}' is not a comma-separated list of {kind.__name__}")


def parse_slowdown(s):
    if s in ("none", "-"):
        return None
    try:
        rank, factor = s.split("=")
        rank, factor = int(rank), float(factor)
    except ValueError:
        die(f"--slowdown: '{s}' is not '-' or RANK=FACTOR")
    if rank < 0 or factor < 1:
        die(f"--slowdown: '{s}': need RANK >= 0 and FACTOR >= 1")
    return rank, factor


def build_grid(a):
    grid, left_out = [], []
    for np_, mb, zero, bal, rec, slow in itertools.product(a.ranks, a.micro_batch, a.zero, a.balance, a.recompute,
                                                           a.slowdown):
        s = parse_slowdown(slow)
        if s and s[0] >= np_:
            why = f"np {np_} with slowdown {slow}: there is no rank {s[0]}"
            if why not in left_out:
                left_out.append(why)
            continue
        if np_ == 1 and (zero != a.zero[0] or bal != ("off" if "off" in a.balance else a.balance[0])):
            continue  # one rank: one shard and one split, the same run as the kept one
        cfg = dict(np=np_, micro_batch=mb, zero=zero, balance=bal, recompute=rec, slowdown=slow)
        if cfg not in grid:
            grid.append(cfg)
    return grid, left_out


def key(cfg):
    return (cfg["np"], cfg["micro_batch"], cfg["zero"], cfg["balance"], cfg["recompute"], cfg["slowdown"])


def tag(cfg):
    return (f"np{cfg['np']}_b{cfg['micro_batch']}_z{cfg['zero']}_{cfg['balance']}_{cfg['recompute']}_"
            f"{cfg['slowdown'].replace('=', 'x')}")


def label(cfg):
    text = f"np {cfg['np']} b {cfg['micro_batch']}"
    if cfg["np"] > 1:
        text += f"\nZeRO {cfg['zero']} {cfg['balance']}"
    if cfg["recompute"] != "none":
        text += f"\nrecompute {cfg['recompute']}"
    if cfg["slowdown"] != "none":
        r, f = cfg["slowdown"].split("=")
        text += f"\nrank {r} {f}x slow"
    return text


class Runner:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.join(a.build_dir, "llamatrain")
        self.mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            self.mpirun.append("--allow-run-as-root")
        self.env = dict(os.environ)
        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            self.env.pop(v, None)
        self.env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.plans = {}

    def run(self, cmd, log):
        if self.a.dry_run:
            print("  " + " ".join(cmd))
            return
        with open(log, "w") as f:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        if rc != 0:
            die(f"exit status {rc} from: {' '.join(cmd)}\n       see {log}", code=1)

    def train(self, cfg, metrics, extra=("--epochs", "1")):
        cmd = [*self.mpirun, "-np", str(cfg["np"]), self.bin, "train", *TRAIN_FLAGS, "--data", self.a.data,
               "--batch-size", str(cfg["micro_batch"]), "--global-batch", str(self.a.global_batch),
               "--zero", str(cfg["zero"]), "--balance", cfg["balance"], "--metrics", metrics, *extra]
        s = parse_slowdown(cfg["slowdown"])
        if s:
            cmd += ["--simulate-slowdown", cfg["slowdown"]]
        if cfg["balance"] == "static":
            w = [1 / s[1] if s and r == s[0] else 1.0 for r in range(cfg["np"])]
            cmd += ["--rank-weights", ",".join(f"{x:g}" for x in w)]
        if cfg["recompute"] != "none":
            cmd += ["--recompute", cfg["recompute"]]
        if os.path.exists(metrics):
            os.remove(metrics)  # the trainer appends
        self.run(cmd, metrics[:-6] + ".log")

    def plan(self, cfg, out_json):
        cmd = [self.bin, "plan", "--calibration", self.a.calibration, "--hostfile", self.a.hostfile,
               "--np", str(cfg["np"]), "--model-config", MODEL, "--data", self.a.data,
               "--global-batch", str(self.a.global_batch), "--batch-size", str(cfg["micro_batch"]),
               "--zero", str(cfg["zero"]), "--recompute", cfg["recompute"], "--json"]
        if cfg["slowdown"] != "none":
            cmd += ["--simulate-slowdown", cfg["slowdown"]]
        if tuple(cmd) in self.plans:  # balance modes share a plan
            return self.plans[tuple(cmd)]
        if self.a.dry_run:
            print("  " + " ".join(cmd))
            return None
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if p.returncode != 0:
            die(f"plan failed ({p.stderr.strip()}): {' '.join(cmd)}", code=1)
        with open(out_json, "w") as f:
            f.write(p.stdout)
        self.plans[tuple(cmd)] = json.loads(p.stdout)
        return self.plans[tuple(cmd)]


def predicted_epoch(cfg, p):
    """The planner's epoch for the way the trainer runs this balance mode; (seconds, split)."""
    eq, bal, steps = p["equal"], p["balanced"], p["steps_per_epoch"]
    if cfg["np"] == 1 or cfg["balance"] == "off":
        return eq["epoch_s"], eq["split"]
    if cfg["balance"] == "static":
        # Weights 1/FACTOR for the slow rank give the balanced split; without a slowdown, equal.
        return (bal["epoch_s"], bal["split"]) if cfg["slowdown"] != "none" else (eq["epoch_s"], eq["split"])
    # auto: equal batches until the first decision, then the balanced split if it gains > 3%.
    if bal["step_s"] < (1 - AUTO_MIN_GAIN) * eq["step_s"]:
        first = min(AUTO_FIRST_DECISION_STEP, steps)
        return first * eq["step_s"] + (steps - first) * bal["step_s"], bal["split"]
    return eq["epoch_s"], eq["split"]


def cpu_busy_s():
    """Seconds of CPU time all processes on the machine have used (user + nice + system + irq + softirq
    + steal in /proc/stat), and those of our finished children (the runs): their difference over a
    run is the CPU time something else took while it ran, the sign of a machine that was not idle."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, ru.ru_utime + ru.ru_stime


def epoch_record(metrics):
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "epoch":
                return j
    die(f"{metrics}: no epoch record", code=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default=env_or("RANKS", "1,2"))
    ap.add_argument("--micro-batch", default=env_or("MICRO_BATCH", "4,8"))
    ap.add_argument("--zero", default=env_or("ZERO", "0,1,2"))
    ap.add_argument("--balance", default=env_or("BALANCE", "off,auto"))
    ap.add_argument("--recompute", default=env_or("RECOMPUTE", "none"))
    ap.add_argument("--slowdown", default=env_or("SLOWDOWN", "none"))
    ap.add_argument("--global-batch", type=int, default=int(env_or("GLOBAL_BATCH", "32")))
    ap.add_argument("--repeats", type=int, default=int(env_or("REPEATS", "3")))
    ap.add_argument("--cal-steps", type=int, default=int(env_or("CAL_STEPS", "30")))
    ap.add_argument("--data", default=os.environ.get("DATA"))
    ap.add_argument("--build-dir", default=env_or("BUILD_DIR", "build"))
    ap.add_argument("--work", default=os.environ.get("WORK"))
    ap.add_argument("--results", default=env_or("RESULTS", os.path.join(REPO, "benchmarks", "results", "sweep")))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--replot", action="store_true", help="redraw the charts from RESULTS.csv, run nothing")
    a = ap.parse_args()
    if a.replot:
        a.results = os.path.abspath(a.results)
        with open(a.results + ".csv") as f:
            rows = list(csv.DictReader(f))
        # What the CSV does not hold comes from the options, as given to the sweep that wrote it.
        a.repeats = max(int(r["repeats"]) for r in rows)
        a.data_name, a.seq_len = "builtin:factqa", SEQ_LEN
        if a.data:
            p = subprocess.run([os.path.join(REPO, a.build_dir, "llamatrain"), "plan", "--model-config", MODEL,
                                "--data", a.data, "--global-batch", str(a.global_batch), "--json"],
                               capture_output=True, text=True)
            a.data_name, a.seq_len = os.path.basename(a.data), json.loads(p.stdout)["seq_len"]
        for r in rows:
            r["np"] = int(r["np"])
        plot(rows, a)
        return 0

    a.ranks = parse_list(a.ranks, "ranks", int)
    a.micro_batch = parse_list(a.micro_batch, "micro-batch", int)
    a.zero = parse_list(a.zero, "zero", int)
    a.balance = parse_list(a.balance, "balance")
    a.recompute = parse_list(a.recompute, "recompute")
    a.slowdown = ["none" if parse_slowdown(v) is None else v for v in parse_list(a.slowdown, "slowdown")]
    if any(n < 1 for n in a.ranks):
        die("--ranks: values must be >= 1")
    if any(z not in (0, 1, 2) for z in a.zero):
        die("--zero: stages are 0, 1 and 2")
    if any(b not in ("off", "static", "auto") for b in a.balance):
        die("--balance: modes are off, static and auto")
    if any(r not in ("none", "attn", "full") for r in a.recompute):
        die("--recompute: values are none, attn and full")
    bad = [b for b in a.micro_batch if b < 1 or a.global_batch % b]
    if bad:
        die(f"--micro-batch {bad}: must divide --global-batch {a.global_batch}")
    if a.repeats < 1 or a.cal_steps < 2:
        die("--repeats must be >= 1 and --cal-steps >= 2")
    a.build_dir = os.path.abspath(os.path.join(REPO, a.build_dir))
    a.work = os.path.abspath(a.work or os.path.join(a.build_dir, "bench", "sweep"))
    a.results = os.path.abspath(a.results)
    binary = os.path.join(a.build_dir, "llamatrain")
    if not os.access(binary, os.X_OK):
        die(f"{binary} not built (scripts/build.sh)")
    if not shutil.which("mpirun"):
        die("mpirun not found (scripts/install-deps.sh)")
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(os.path.dirname(a.results), exist_ok=True)

    # Can train recompute? Ask its --help, so that the day it can, the sweep measures it.
    train_help = subprocess.run([binary, "train", "--help"], capture_output=True, text=True).stdout
    train_recomputes = "--recompute" in train_help
    grid, left_out = build_grid(a)
    runnable = [c for c in grid if c["recompute"] == "none" or train_recomputes]
    not_run = [c for c in grid if c not in runnable]
    print(f"sweep: {len(grid)} configurations ({len(runnable)} to run x {a.repeats} repeats), "
          f"global batch {a.global_batch}, model {MODEL}, data {a.data or 'builtin:factqa (seq 128)'}")
    for s in left_out:
        print(f"sweep: left out {s}")
    if not_run:
        print(f"sweep: NOT RUN (this train has no --recompute option): "
              f"{len(not_run)} configuration(s) with recompute {sorted({c['recompute'] for c in not_run})}; "
              "their rows carry the planner's prediction only")

    runner = Runner(a)
    if a.data:
        a.data = os.path.abspath(a.data)
        if not os.path.exists(a.data):
            die(f"--data {a.data}: no such file")
        a.data_name = os.path.basename(a.data)
    else:
        a.data, a.data_name = os.path.join(a.work, "factqa.h5"), "builtin:factqa"
    if not os.path.exists(a.data):
        runner.run([binary, "prepare", "--qa", "builtin:factqa", "--prompt-type", "3", "--vocab-size", "512",
                    "--seq-len", str(SEQ_LEN), "--test-split", "0.1", "--seed", "1", "--output", a.data],
                   os.path.join(a.work, "prepare.log"))
    # A hostfile of this machine with a slot per rank (ranks beyond the cores are oversubscribed
    # and get one thread each, as the trainer gives them).
    cores = os.cpu_count() or 1
    a.hostfile = os.path.join(a.work, "hostfile")
    with open(a.hostfile, "w") as f:
        f.write(f"localhost slots={max(cores, max(a.ranks))}\n")

    # The dataset's sequence length, as the planner reads it.
    if a.dry_run:
        a.seq_len = SEQ_LEN
    else:
        p = subprocess.run([binary, "plan", "--model-config", MODEL, "--data", a.data, "--global-batch",
                            str(a.global_batch), "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            die(f"plan on {a.data} failed: {p.stderr.strip()}")
        a.seq_len = json.loads(p.stdout)["seq_len"]

    # One calibration for the whole sweep: a short run per rank count.
    a.calibration = os.path.join(a.work, "calibration.json")
    cal_zero = 1 if 1 in a.zero else a.zero[0]
    cal_metrics = []
    print(f"sweep: calibrating: {a.cal_steps} steps per rank count at micro-batch {a.micro_batch[0]}, "
          f"ZeRO {cal_zero}, equal batches, no slowdown")
    for np_ in sorted(set(c["np"] for c in grid)):
        m = os.path.join(a.work, f"calibration_np{np_}.jsonl")
        cfg = dict(np=np_, micro_batch=a.micro_batch[0], zero=cal_zero if np_ > 1 else a.zero[0], balance="off",
                   recompute="none", slowdown="none")
        busy0, ours0 = cpu_busy_s()
        runner.train(cfg, m, extra=("--max-steps", str(a.cal_steps)))
        busy1, ours1 = cpu_busy_s()
        if not a.dry_run:
            print(f"sweep: calibration run -np {np_}: other processes used "
                  f"{max(0.0, (busy1 - busy0) - (ours1 - ours0)):.1f} CPU s meanwhile")
        cal_metrics.append(m)
    cmd = [binary, "plan", "--hostfile", a.hostfile, "--model-config", MODEL, "--seq-len", str(a.seq_len),
           "--output", a.calibration]
    for m in cal_metrics:
        cmd += ["--calibrate", m]
    runner.run(cmd, os.path.join(a.work, "calibration.txt"))
    if not a.dry_run:
        print(open(os.path.join(a.work, "calibration.txt")).read(), end="")

    # The planner's prediction of every configuration (also those that cannot run yet).
    print("sweep: plans")
    plans = {key(c): runner.plan(c, os.path.join(a.work, tag(c) + ".plan.json")) for c in grid}

    runs_csv = a.results + "_runs.csv"
    runs = []
    t0 = time.time()
    for rep in range(1, a.repeats + 1):
        for cfg in runnable:
            m = os.path.join(a.work, f"{tag(cfg)}_r{rep}.jsonl")
            busy0, ours0 = cpu_busy_s()
            runner.train(cfg, m)
            if a.dry_run:
                continue
            busy1, ours1 = cpu_busy_s()
            other = max(0.0, (busy1 - busy0) - (ours1 - ours0))
            e = epoch_record(m)
            runs.append(dict(cfg, repeat=rep, epoch_time_s=e["epoch_time_s"], tokens_per_s=e["tokens_per_s"],
                             steps=e["step"], split=";".join(str(k) for k in e.get("split", [])), other_cpu_s=other))
            print(f"sweep: {tag(cfg)} repeat {rep}: {e['epoch_time_s']:.2f} s, {e['tokens_per_s']:.0f} tokens/s "
                  f"(other processes used {other:.1f} CPU s meanwhile, {time.time() - t0:.0f} s in)", flush=True)
    if a.dry_run:
        return 0

    fields = ["np", "micro_batch", "zero", "balance", "recompute", "slowdown", "repeat", "epoch_time_s",
              "tokens_per_s", "steps", "split", "other_cpu_s"]
    with open(runs_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in runs:
            w.writerow({k: (f"{r[k]:.3f}" if k == "epoch_time_s" else f"{r[k]:.0f}" if k == "tokens_per_s" else
                            f"{r[k]:.1f}" if k == "other_cpu_s" else r[k]) for k in fields})

    rows = []
    for cfg in grid:
        p = plans[key(cfg)]
        pred, pred_split = predicted_epoch(cfg, p)
        pred_tps = p["steps_per_epoch"] * a.global_batch * a.seq_len / pred
        rs = [r for r in runs if key(r) == key(cfg)]
        row = dict(cfg, steps_per_epoch=p["steps_per_epoch"], predicted_epoch_s=f"{pred:.3f}",
                   predicted_tokens_per_s=f"{pred_tps:.0f}", predicted_split=";".join(map(str, pred_split)))
        if rs:
            t = [r["epoch_time_s"] for r in rs]
            med = statistics.median(t)
            row.update(status="measured", repeats=len(rs), epoch_s_median=f"{med:.3f}", epoch_s_min=f"{min(t):.3f}",
                       epoch_s_max=f"{max(t):.3f}",
                       tokens_per_s=f"{statistics.median(r['tokens_per_s'] for r in rs):.0f}",
                       final_split=rs[-1]["split"], predicted_over_measured=f"{pred / med:.3f}")
        else:
            row.update(status="not run: this train has no --recompute", repeats=0)
        rows.append(row)
    out_fields = ["np", "micro_batch", "zero", "balance", "recompute", "slowdown", "status", "repeats",
                  "epoch_s_median", "epoch_s_min", "epoch_s_max", "tokens_per_s", "final_split", "steps_per_epoch",
                  "predicted_epoch_s", "predicted_tokens_per_s", "predicted_split", "predicted_over_measured"]
    with open(a.results + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=out_fields, lineterminator="\n", restval="")
        w.writeheader()
        w.writerows(rows)
    print(f"sweep: wrote {a.results}.csv and {runs_csv}")
    print(f"{'configuration':<44} {'measured s':>10} {'(min-max)':>13} {'tokens/s':>9} {'predicted s':>11} {'ratio':>6}")
    for r in rows:
        name = label(r).replace("\n", " ")
        if r["status"] == "measured":
            print(f"{name:<44} {r['epoch_s_median']:>10} {r['epoch_s_min'] + '-' + r['epoch_s_max']:>13} "
                  f"{r['tokens_per_s']:>9} {r['predicted_epoch_s']:>11} {r['predicted_over_measured']:>6}")
        else:
            print(f"{name:<44} {'not run':>10} {'':>13} {'':>9} {r['predicted_epoch_s']:>11}")
    ratios = [float(r["predicted_over_measured"]) for r in rows if r["status"] == "measured"]
    if ratios:
        within = sum(abs(x - 1) <= 0.15 for x in ratios)
        print(f"sweep: predicted/measured median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
              f"{max(ratios):.3f}; {within} of {len(ratios)} within 15%")

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"sweep: {sys.executable} has no matplotlib; wrote the CSVs only (run with /usr/bin/python3 after "
              "scripts/install-deps.sh --bench)", file=sys.stderr)
        return 0
    plot(rows, a)
    return 0


def plot(rows, a):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(rows)))
    labels = [label(r) for r in rows]
    width = 0.4
    measured = [r["status"] == "measured" for r in rows]
    note = (f"CPU, {os.cpu_count()} cores; one epoch of {MODEL} on {a.data_name} (seq {a.seq_len}, global batch "
            f"{a.global_batch}); median of {a.repeats} runs, whiskers min-max; planned: llamatrain plan, calibrated once")

    for what, png in (("epoch", a.results + "_epoch.png"), ("tokens", a.results + "_tokens.png")):
        fig, ax = plt.subplots(figsize=(max(7, 0.75 * len(rows) + 2), 5))
        if what == "epoch":
            med = [float(r["epoch_s_median"]) if m else 0 for r, m in zip(rows, measured)]
            lo = [med[i] - float(r["epoch_s_min"]) if measured[i] else 0 for i, r in enumerate(rows)]
            hi = [float(r["epoch_s_max"]) - med[i] if measured[i] else 0 for i, r in enumerate(rows)]
            pred = [float(r["predicted_epoch_s"]) for r in rows]
            ax.set_ylabel("epoch time (s)")
            ax.set_title("Epoch time per configuration: measured vs planned")
        else:
            med = [float(r["tokens_per_s"]) if m else 0 for r, m in zip(rows, measured)]
            # tokens/s of the fastest and slowest repeat (the same tokens per epoch in every repeat)
            lo = [med[i] - med[i] * float(r["epoch_s_median"]) / float(r["epoch_s_max"]) if measured[i] else 0
                  for i, r in enumerate(rows)]
            hi = [med[i] * float(r["epoch_s_median"]) / float(r["epoch_s_min"]) - med[i] if measured[i] else 0
                  for i, r in enumerate(rows)]
            pred = [float(r["predicted_tokens_per_s"]) for r in rows]
            ax.set_ylabel("training tokens/s (all ranks)")
            ax.set_title("Throughput per configuration: measured vs planned")
        ax.bar([i - width / 2 for i in x], med, width, yerr=[lo, hi], capsize=2, color="#1f77b4", label="measured")
        ax.bar([i + width / 2 for i in x], pred, width, color="#ff7f0e", alpha=0.8, label="planned")
        for i, r in enumerate(rows):
            if measured[i]:
                ax.annotate(f"{float(r['predicted_over_measured']):.2f}x" if what == "epoch" else
                            f"{1 / float(r['predicted_over_measured']):.2f}x",
                            (i, max(med[i] + hi[i], pred[i])), ha="center", va="bottom", fontsize=7)
            else:
                ax.annotate("not run\n(no train\n--recompute)", (i - width / 2, 0), ha="center", va="bottom",
                            fontsize=6, rotation=0)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.margins(y=0.22)
        ax.legend(fontsize=8, loc="upper center", ncol=2)
        fig.text(0.01, 0.005, note + ("; labels: planned/measured" if what == "epoch" else
                                      "; labels: planned/measured tokens/s"), fontsize=6.5)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(png, dpi=110)
        plt.close(fig)
        print(f"sweep: wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
