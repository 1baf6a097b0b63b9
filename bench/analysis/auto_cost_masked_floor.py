#!/usr/bin/env python3
"""Does a floor on a masked unit's time fix auto's worst picks off the suites?

Issue 21 goal 1. auto's worst offsuite pick, random:seed=211 at 16/1 (1.41x on the H100, 1.44x on the H200), is
node's shape with compact units of up to 2192 masked tokens against per-query (docs/planners.md, "Other model forms":
its longest unit costs ~35-40 us per 1000 masked tokens, more than any linear price of it). Tested here: the shipped
table's prediction raised to a floor, max(linear, b x K), K one of
  masked_unit_kt  the longest masked unit's tokens (auto's masked_kt feature), thousands;
  masked_tile_kt  the most tokens any unit runs in K/V tiles that apply masks (plan_units_dump.cpp), thousands:
                  a compact unit whose shared root all its entries see runs its root's tiles unmasked;
for b in B_US_PER_KT. Scored as auto_cost_forms.py scores forms (the predicted-fastest timed plan of auto, node
and per-query within 1.03x of the fastest): the H100 suites (train, in sample: b is the only parameter) and the
offsuite runs on the H100 and the H200 (held out).

Needs numpy, scipy (auto_cost_makespan), build/cpu/treeattn and build/cpu/libtreeattn.a (a c++20 compiler builds
plan_units_dump.cpp once, into /tmp).
Run from the repository root:
  python3 bench/analysis/auto_cost_masked_floor.py [--out bench/analysis/auto_cost_masked_floor_results.txt]
"""
import argparse
import datetime
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import auto_cost_forms as F  # noqa: E402
import auto_cost_makespan as MS  # noqa: E402  (its plan dumper, plan_units_dump.cpp)

D = F.D
ROOT = D.ROOT
KEEPNODE = "/tmp/auto_cost_keepnode.json"  # written by auto_cost_data.cli_plans (auto at margin 0.99)
B_US_PER_KT = [30, 40, 45, 50, 55, 60, 70, 80]


def masked_features(recs):
    """Each record's plan (the variant it was matched as) through plan_units_dump.cpp: adds f['masked_tile_kt'] and
    f['masked_unit_kt']. Returns (plans dumped, records whose dumped plan differs from the matched one)."""
    variant = lambda r: r["matched_as"].replace("auto@keepnode", "auto@" + KEEPNODE)
    req = {(r["heads"], variant(r), "-", r["config"][0]) for r in recs}
    got = MS.dump(req)
    mismatched = 0
    for r in recs:
        j = got[(r["heads"], variant(r), "-", r["config"][0])]
        mismatched += tuple(j[k] for k in D.KEYS) != r["sig"]
        r["f"]["masked_tile_kt"], r["f"]["masked_unit_kt"] = j["masked_tile_kt"], j["masked_unit_kt"]
    return len(req), mismatched


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/analysis/auto_cost_masked_floor_results.txt"))
    args = ap.parse_args()
    recs, drops, _ = D.load_records()
    nplans, mismatched = masked_features(recs)
    plans = F.build_plans(recs, "us")
    X = F.matrix(plans)
    base = F.Fixed("shipped", F.SHIPPED, "").predict(X)
    sels = {"train": lambda p: p["set"] == "train", "h100": lambda p: p["set"] == "h100",
            "h200": lambda p: p["set"] == "h200"}
    score = lambda pred: {k: F.score(plans, pred, s, scale_fit=(k == "h200")) for k, s in sels.items()}
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# auto's shipped table with a floor on masked units, offline (us; decisions = configs within 1.03x)",
             f"# date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%MZ}; plans of commit {head}; command: "
             f"python3 bench/analysis/auto_cost_masked_floor.py {' '.join(sys.argv[1:])}",
             f"records {len(recs)} (dropped {sum(drops.values())}); plans dumped {nplans}, summary mismatches {mismatched}",
             ""]
    r0 = score(base)
    row = lambda name, r: f"{name:<34}" + "".join(f"{k} {r[k]['hits']:>3}/{r[k]['n']:<3}   " for k in sels)
    lines.append(row("shipped (no floor)", r0))
    for k in sels:
        for key, (pl, tp, best) in sorted(r0[k]["misses"].items(), key=lambda kv: -kv[1][1] / kv[1][2]):
            lines.append(f"    miss {k:<5} {key[2][1]:>5} {key[2][0].replace(ROOT + '/', '')[:58]:<58} {tp / best:.2f}x {pl}")
    for feat in ("masked_unit_kt", "masked_tile_kt"):
        K = np.array([p["f"][feat] for p in plans])
        lines.append("")
        for b in B_US_PER_KT:
            r = score(np.maximum(base, b * K))
            lines.append(row(f"max(shipped, {b:>2} us x {feat})", r))
            for k in sels:
                for key in sorted(set(r0[k]["misses"]) - set(r[k]["misses"])):
                    lines.append(f"    fixed {k:<5} {key[2][1]:>5} {key[2][0].replace(ROOT + '/', '')[:58]}")
                for key in sorted(set(r[k]["misses"]) - set(r0[k]["misses"])):
                    pl, tp, best = r[k]["misses"][key]
                    lines.append(f"    new   {k:<5} {key[2][1]:>5} {key[2][0].replace(ROOT + '/', '')[:58]:<58} {tp / best:.2f}x {pl}")
    open(args.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
