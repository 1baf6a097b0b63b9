#!/usr/bin/env python3
"""Summary of scripts/planner_ab.sh: per (config, heads) the min over rounds
of variant A's and B's median us (eager and graph), their ratio B / A, and
the geomean ratios. Usage: planner_ab_summary.py DIR"""
import collections
import glob
import json
import math
import os
import re
import sys


def short(workload):
    w = re.sub(r"^medusa:.*APPS_tree_size(\d+)\.json:record=0:step=10:prefix=", r"medusa\1:", workload)
    return re.sub(r"^(tot|medusa):[^:]*/", r"\1:", w)


def main(d):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in sorted(glob.glob(os.path.join(d, "*_*_[AB].json"))):
        heads, _, v = os.path.basename(f)[:-5].split("_")
        try:
            doc = json.load(open(f))
        except ValueError as e:
            print(f"unreadable {f}: {e}")
            continue
        for r in doc["records"] if isinstance(doc, dict) else doc:
            runs[(short(r["workload"]), heads.replace("-", "/"))][v].append(r)
    print(f"{'config':58s} {'heads':5s} {'A us':>7s} {'B us':>7s} {'B/A':>6s} {'A gr':>7s} {'B gr':>7s} {'B/A':>6s} {'err':>7s}")
    eager, graph = [], []
    for (cfg, heads), v in sorted(runs.items()):
        if not v["A"] or not v["B"]:
            continue
        a = min(r["us"] for r in v["A"]); b = min(r["us"] for r in v["B"])
        ag = min(r.get("us_graph") or math.nan for r in v["A"]); bg = min(r.get("us_graph") or math.nan for r in v["B"])
        err = max((r.get("max_rel_err") or 0) for r in v["A"] + v["B"])
        eager.append(b / a)
        if ag == ag and bg == bg:
            graph.append(bg / ag)
        print(f"{cfg[:58]:58s} {heads:5s} {a:7.1f} {b:7.1f} {b / a:6.3f} {ag:7.1f} {bg:7.1f} {bg / ag:6.3f} {err:7.1e}")
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan
    print(f"geomean B/A over {len(eager)} configs: eager {gm(eager):.3f}, graph {gm(graph):.3f}; "
          f"B faster by > 3 %: {sum(x < 0.97 for x in eager)}, slower by > 3 %: {sum(x > 1.03 for x in eager)} (eager)")


if __name__ == "__main__":
    main(sys.argv[1])
