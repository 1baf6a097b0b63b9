#!/usr/bin/env python3
"""Plots of a `treeattn bench --suite` run, like the papers' figures.

Usage: plot_suite.py RESULTS.json OUT_DIR
Writes OUT_DIR/speedup.png (bars per planner: speedup over per-query, one group
per config), OUT_DIR/floor.png (fraction of the roofline: the larger of the unique-KV
floor and the compute floor; the unique-KV floor for results that predate it) and
OUT_DIR/normalized.png (performance normalised to the best planner per config).
Needs matplotlib (Debian: python3-matplotlib).
"""
import io
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["records"] if isinstance(data, dict) else data


def table(records):
    configs, planners, cell = [], [], {}
    for r in records:
        cfg = f'{r["workload"]} @{r["num_qo_heads"]}/{r["num_kv_heads"]}'
        if cfg not in configs:
            configs.append(cfg)
        if r["planner"] not in planners:
            planners.append(r["planner"])
        cell[(cfg, r["planner"])] = r
    return configs, planners, cell


def bars(configs, planners, value, ylabel, title, path, hline=None, per_panel=16):
    """Grouped bars, one group per config, `per_panel` configs per row of panels."""
    panels = [configs[i:i + per_panel] for i in range(0, len(configs), per_panel)] or [[]]
    width = 0.8 / max(1, len(planners))
    fig, axes = plt.subplots(len(panels), 1, figsize=(16, 4.2 * len(panels)), squeeze=False)
    for ax, chunk in zip(axes[:, 0], panels):
        for i, p in enumerate(planners):
            ys = [value(c, p) for c in chunk]
            xs = [k + i * width for k in range(len(chunk))]
            ax.bar(xs, [0 if y is None or math.isnan(y) else y for y in ys], width, label=p)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(chunk))])
        ax.set_xticklabels([c.replace(":", "\n", 1) for c in chunk], rotation=60, ha="right", fontsize=6)
        if hline is not None:
            ax.axhline(hline, color="black", linewidth=0.8)
        ax.set_ylabel(ylabel)
    axes[0, 0].set_title(title)
    axes[0, 0].legend(fontsize=7, ncol=min(7, len(planners)))
    fig.tight_layout()
    save_palette_png(fig, path)
    plt.close(fig)


def save_palette_png(fig, path):
    """fig as an 8-bit palette PNG: the plots use a few hundred colours (the
    bars' and the antialiased text's), which 256 hold to within 2/255 per
    channel, at a third of the RGBA file's size (bench/results is committed)."""
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    buffer.seek(0)
    rgb = Image.open(buffer).convert("RGB")
    rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="PNG", optimize=True)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    records = load(sys.argv[1])
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    configs, planners, cell = table(records)
    suite = records[0].get("suite", "suite") if records else "suite"
    device = records[0].get("device", "") if records else ""

    def us(c, p):
        r = cell.get((c, p))
        return r["us"] if r else float("nan")

    def speedup(c, p):
        return us(c, "per-query") / us(c, p)

    def floor(c, p):
        r = cell.get((c, p))
        return r.get("roofline_us", r["floor_us"]) / r["us"] if r else float("nan")

    def normalized(c, p):
        best = min(us(c, q) for q in planners if (c, q) in cell)
        return best / us(c, p)

    bars(configs, planners, speedup, "speedup over per-query", f"{suite} on {device}", os.path.join(out, "speedup.png"), 1.0)
    bars(configs, planners, floor, "fraction of roofline (memory, compute)", f"{suite} on {device}", os.path.join(out, "floor.png"), 1.0)
    bars(configs, planners, normalized, "performance / best", f"{suite} on {device}", os.path.join(out, "normalized.png"))


if __name__ == "__main__":
    main()
