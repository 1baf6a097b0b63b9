#!/usr/bin/env python3
"""Can auto's cost model choose among node's shapes? Tested on a zoo of timed plans.

Reads a zoo run (bench/analysis/device_offsuite_zoo.sh: auto, per-query, node and node's
shape variants, each timed on every config of a suite in one device call), plans every
variant with the CLI at HEAD (`treeattn plan --json`: the auto features; a record whose
plan HEAD no longer makes identically is dropped and counted), then:
  1. with the shipped table (data/auto_cost_h100.json), auto's plan against the variant
     the model predicts fastest, for each variant added alone and for all of them;
  2. the same with the table refitted on the zoo itself (non-negative least squares on
     relative errors and within-config differences, as scripts/fit_auto_cost.py), two
     folds by workload (fit on half the trees, decide on the other half).
Criteria as issue 21's goal 1: (1) within 1.03x of min(node, per-query); (2) within 5 %
of the best plan timed (here: of all variants). Eager medians.
Needs scipy (nnls) and build/cpu/treeattn. Run from the repository root:
  python3 bench/analysis/zoo_decisions.py [ZOO_DIR] > bench/analysis/zoo_decisions.txt
"""
import collections
import datetime
import itertools
import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.optimize import nnls

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZOO = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "bench/results/NVIDIA_H200/offsuite_zoo_9e3d764")
CLI = os.path.join(ROOT, "build/cpu/treeattn")
TABLE = json.load(open(os.path.join(ROOT, "data/auto_cost_h100.json")))["coefficients"]
KEYS = ("units", "segments", "kv_bytes", "partial_bytes")
HEADS = ("32/8", "32/32", "16/1", "64/8")

# The variants and their CLI options, as the device script runs them.
VARIANTS = {"auto": ("auto", ""), "per-query": ("per-query", ""), "node": ("node", "")}
for line in open(os.path.join(ROOT, "bench/analysis/device_offsuite_zoo.sh")):
    for m in re.finditer(r'"(node_[a-z0-9_]+)\|node\|([^"]*)"', line):
        VARIANTS[m.group(1)] = ("node", m.group(2))
SPECS = [l.strip().lstrip("+") for l in open(os.path.join(ROOT, "data/suites/offsuite.suite"))
         if ":" in l and not l.startswith("#") and not re.match(r"^(quick_)?heads:|^head_dim:|^dtype:|^page_size:", l)]
norm = lambda w: w.replace(ROOT + "/", "")


def plan_features():
    def job(arg):
        name, heads = arg
        planner, opts = VARIANTS[name]
        cmd = [CLI, "plan", "--heads", heads, "-p", planner, "--json"]
        for o in opts.split():
            cmd += ["--plan-opt", o]
        for s in SPECS:
            cmd += ["-w", s]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
        return {f"{name}|{heads}|{norm(x['workload'])}": x for x in json.loads(r.stdout)}
    out = {}
    with ThreadPoolExecutor(2) as ex:
        for part in ex.map(job, [(n, h) for n in VARIANTS for h in HEADS]):
            out.update(part)
    return out


def main():
    F = plan_features()
    T, FEAT, dropped = collections.defaultdict(dict), collections.defaultdict(dict), collections.Counter()
    for v in sorted(os.listdir(ZOO)):
        if not os.path.isdir(os.path.join(ZOO, v)):
            continue
        for x in json.load(open(os.path.join(ZOO, v, "results.json")))["records"]:
            h, w = f"{x['num_qo_heads']}/{x['num_kv_heads']}", norm(x["workload"])
            f = F.get(f"{v}|{h}|{w}")
            if f is None or any(f[q] != x[q] for q in KEYS):
                dropped[v] += 1
                continue
            T[(w, h)][v], FEAT[(w, h)][v] = x["us"], f["auto_features"]
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# zoo decisions; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%MZ}; plans of commit {head};"
          f" zoo {os.path.relpath(ZOO, ROOT)}; command: python3 bench/analysis/zoo_decisions.py")
    T = {k: t for k, t in T.items() if "auto" in t and "node" in t and "per-query" in t}
    print(f"configs {len(T)}, variants {len(VARIANTS)}, records dropped (plan no longer made as timed): {sum(dropped.values())} {dict(dropped)}")
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    best = {k: min(t.values()) for k, t in T.items()}
    crit1 = lambda k, v: T[k][v] <= 1.03 * min(T[k]["node"], T[k]["per-query"])
    print(f"auto: criterion 1 on {sum(crit1(k, 'auto') for k in T)}, within 5 % of the best variant on "
          f"{sum(T[k]['auto'] <= 1.05 * best[k] for k in T)}; auto / best variant geomean {g([T[k]['auto'] / best[k] for k in T]):.3f}; "
          f"node / best {g([T[k]['node'] / best[k] for k in T]):.3f}")
    print("fastest variant, configs:", dict(collections.Counter(min(T[k], key=T[k].get) for k in T).most_common()))
    variants = [v for v in VARIANTS if v != "auto"]

    def decide(coef, keys, cands, label):
        res = []
        for k in keys:
            cs = [c for c in cands if c in T[k]] + ["auto"]
            pick = min(cs, key=lambda c: sum(coef.get(n, 0) * FEAT[k][c].get(n, 0) for n in FEAT[k][c]))
            res.append((T[k][pick] / T[k]["auto"], T[k][pick] / best[k], crit1(k, pick)))
        print(f"  {label:34} vs auto {g([r[0] for r in res]):.3f}; >3 % faster {sum(r[0] < 0.97 for r in res):3}, "
              f">3 % slower {sum(r[0] > 1.03 for r in res):3}; criterion 1 {sum(r[2] for r in res):3} "
              f"(auto {sum(crit1(k, 'auto') for k in keys)}); within 5 % of best {sum(r[1] <= 1.05 for r in res):3} "
              f"(auto {sum(T[k]['auto'] <= 1.05 * best[k] for k in keys)}) of {len(keys)}")

    print("\n## 1. the shipped table choosing between auto's plan and the variants")
    decide(TABLE, list(T), [], "auto alone")
    for v in variants:
        decide(TABLE, list(T), [v], "+ " + v)
    decide(TABLE, list(T), variants, "+ all variants")

    print("\n## 2. the table refitted on the zoo, two folds by workload (decisions on the held-out half)")
    names = list(dict.fromkeys(list(TABLE) + ["masked_kt"]))
    works = sorted({k[0] for k in T})
    for fold in (0, 1):
        train = [k for k in T if works.index(k[0]) % 2 == fold]
        test = [k for k in T if works.index(k[0]) % 2 != fold]
        rows, ys = [], []
        for k in train:
            tmin = best[k]
            X = {v: np.array([FEAT[k][v].get(n, 0) for n in names]) for v in T[k]}
            for v in T[k]:
                rows.append(0.3 * X[v] / T[k][v]); ys.append(0.3)
            for a, b in itertools.combinations(T[k], 2):
                rows.append((X[a] - X[b]) / tmin); ys.append((T[k][a] - T[k][b]) / tmin)
        c, _ = nnls(np.array(rows), np.array(ys))
        coef = dict(zip(names, c))
        print(f" fold {fold}: fitted on {len(train)} configs: " + ", ".join(f"{n} {v:.4g}" for n, v in coef.items() if v > 0))
        decide(coef, test, ["per-query", "node"], "refit: node, per-query")
        decide(coef, test, variants, "refit: all variants")


if __name__ == "__main__":
    main()
