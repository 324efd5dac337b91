"""Bar chart of epoch time per configuration from benchmarks/epoch_sweep.sh's CSV."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path: str, png_path: str) -> None:
    rows = list(csv.DictReader(open(csv_path)))
    labels, times, colours = [], [], []
    for r in rows:
        slow = "" if r["slowdown"] == "-" else f"\nrank {r['slowdown'].replace('=', ' slowed ')}x"
        labels.append(f"np {r['np']} ZeRO {r['zero']}\n{r['balance']}{slow}")
        times.append(float(r["epoch_time_s"]))
        colours.append({"off": "#7f7f7f", "static": "#1f77b4", "auto": "#2ca02c"}[r["balance"]])
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.5))
    bars = ax.bar(range(len(rows)), times, color=colours)
    for b, r in zip(bars, rows):
        text = f"{float(r['epoch_time_s']):.1f} s"
        if r["vs_balance_off"] and r["balance"] != "off":
            text += f"\n{float(r['vs_balance_off']):.2f}x off"
        ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("epoch time (s)")
    ax.set_title("llamatrain: one epoch of the tiny job per configuration (CPU, simulated slow rank)")
    ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    print(f"wrote {png_path}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
