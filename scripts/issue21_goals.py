#!/usr/bin/env python3
"""Issue 21's goals 1 and 3 from `treeattn bench --suite` results.

Goal 1 (auto): criterion 1, auto <= 1.03 x min(node, per-query) on every
config; criterion 2, auto within 5 % of the best planner run on >= 90 % of
configs. Goal 3 (latency-bound and high-GQA trees): geomean read_us / us of
auto on the fasttree and pat suites per head config, and the configs whose
bare read (read_us) is under 10 us against read_us + 6 us.

A config is (workload, qo heads, kv heads); times are the medians `us` of the
records (eager runs), or with --time us_graph those of the CUDA-graph replays
(where a record has none, bench skipped it past 1 ms, its `us`). Usage:
  scripts/issue21_goals.py bench/results/NVIDIA_H100_80GB_HBM3/{fasttree,pat,deft,flashforge}/results.json [--show] [--time us_graph]
"""
import argparse
import collections
import json
import math
import os


def load(path, time_key):
    doc = json.load(open(path))
    recs = doc["records"] if isinstance(doc, dict) else doc
    suite = doc.get("suite") if isinstance(doc, dict) else None
    suite = suite or os.path.basename(os.path.dirname(os.path.abspath(path)))
    configs = collections.defaultdict(dict)
    for r in recs:
        key = (r["workload"], r["num_qo_heads"], r["num_kv_heads"])
        configs[key][r["planner"]] = dict(r, us=r.get(time_key) or r["us"])
    commits = sorted({r.get("commit", "?") for r in recs})
    return suite, configs, commits


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def short(workload, width=58):
    """The workload spec without the directory of its recorded file, cut to width."""
    kind, sep, rest = workload.partition(":")
    w = kind + sep + rest.rsplit("/", 1)[-1] if "/" in rest.split(":", 1)[0] else workload
    return w if len(w) <= width else w[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="results.json of `treeattn bench --suite` (one per suite)")
    ap.add_argument("--show", action="store_true", help="list the configs that miss a criterion")
    ap.add_argument("--time", choices=["us", "us_graph"], default="us",
                    help="the time of a record: eager runs (us) or CUDA-graph replays (us_graph)")
    args = ap.parse_args()

    total = c1_all = c2_all = 0
    goal3 = collections.defaultdict(list)  # heads -> read_us / us of auto (fasttree, pat)
    small = []  # (suite, config, read_us, auto us) with read_us < 10
    for path in args.results:
        suite, configs, commits = load(path, args.time)
        c1 = c2 = n = 0
        misses = []
        for key, by in sorted(configs.items()):
            if "auto" not in by:
                continue
            n += 1
            auto = by["auto"]["us"]
            best_name = min(by, key=lambda p: by[p]["us"])
            best = by[best_name]["us"]
            base = [by[p]["us"] for p in ("node", "per-query") if p in by]
            ok1 = not base or auto <= 1.03 * min(base)
            ok2 = auto <= 1.05 * best
            c1 += ok1
            c2 += ok2
            if not (ok1 and ok2):
                misses.append((key, auto, best_name, best, min(base) if base else float("nan"), ok1, ok2))
            if suite in ("fasttree", "pat"):
                read = by["auto"].get("read_us")
                if read:
                    goal3[f"{key[1]}/{key[2]}"].append(read / auto)
                    if read < 10:
                        small.append((suite, key, read, auto))
        total += n
        c1_all += c1
        c2_all += c2
        print(f"{suite:10s} {n:3d} configs (commit {','.join(commits)}): criterion 1 {c1:3d}, criterion 2 {c2:3d}")
        if args.show:
            for (w, hq, hk), auto, bn, best, base, ok1, ok2 in misses:
                why = ("" if ok1 else f"c1: min(node, per-query) {base:.1f}; ") + ("" if ok2 else f"c2: best {bn} {best:.1f} ({auto / best:.3f}x)")
                print(f"    {short(w):58s} {hq}/{hk:<3d} auto {auto:7.1f}  {why}")
    if total:
        print(f"all {total} configs: criterion 1 {c1_all} ({100 * c1_all / total:.1f} %), "
              f"criterion 2 {c2_all} ({100 * c2_all / total:.1f} %; the goal: 100 % and >= 90 %)")
    targets = {"32/32": 0.85, "32/8": 0.70, "16/8": 0.70, "64/8": 0.70, "16/1": 0.45}
    if goal3:
        print("goal 3, geomean read_us / us of auto on fasttree + pat:")
        for heads in sorted(goal3, key=lambda h: (int(h.split("/")[1]), int(h.split("/")[0]))):
            g = geomean(goal3[heads])
            t = targets.get(heads)
            print(f"    {heads:6s} {g:.3f} over {len(goal3[heads]):2d} configs" + (f" (target {t:.2f})" if t else ""))
        within = [s for s in small if s[3] <= s[2] + 6]
        if small:
            over = [s[3] - s[2] for s in small]
            print(f"    configs with read_us < 10 us: {len(small)}, within read_us + 6 us: {len(within)}; "
                  f"over read_us by {min(over):.1f}-{max(over):.1f} us")
            if args.show:
                for suite, (w, hq, hk), read, auto in sorted(small, key=lambda s: s[3] - s[2]):
                    print(f"    {suite:8s} {short(w):58s} {hq}/{hk:<3d} read {read:5.1f} auto {auto:6.1f}")


if __name__ == "__main__":
    main()
