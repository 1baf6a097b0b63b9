#!/usr/bin/env python3
"""Fits the cost model of the `auto` planner from suite results.

Reads the results.json files that `treeattn bench --suite NAME` writes (any
device: one file per suite), fits the coefficients of
`treeattn::AutoCostModel` (include/treeattn/cost_models.hpp) and writes the
table (data/auto_cost_h100.json is this script's output on the H100 data).

The model prices a plan as coefficients . features. The features are
computed by the library (`auto_cost_features`), read here from
`treeattn plan --json` ("auto_features") for every config of the results
and every candidate planner: so the CLI must plan what the suites ran (the
same commit, and --sms as the suites had it). The features:

  const          1
  launches       attention launches (tile configs used)
  kv_mb          KV bytes the plan loads, MB (1e6)
  unique_kv_mb   the tree's KV bytes, MB
  partial_mb     partial bytes written and read by the merge, MB
  max_unit_kt    the longest unit, thousands of tokens
  kctas          units x kv heads, thousands
  ksegments      segments x kv heads, thousands
  padded_gflop   attention GFLOP with the tiles' padded rows
  wave_kt        per launch, waves of CTAs over the resident slots x its longest unit, thousands of tokens
  masked_kt      the longest masked unit (compact subtrees, packs), thousands of tokens

The fit is non-negative least squares on relative errors: for every config,
each candidate's time (weight 0.3) and the difference between every two
candidates' times (weight 1), both divided by the faster time, so the fit
cares most about which candidate is faster. `auto` leaves `node` only when
the model predicts a gain of more than `margin`: the smallest margin of
0, 0.01, ... 0.10 that meets the most configs on both of issue 21's criteria
(auto <= 1.03 x min(node, per-query); auto within 5 % of the best planner).

A/B pairs of auto's own variants (`scripts/planner_ab.sh` outputs: the same
configs planned two ways and timed alternately) add what the suites'
per-query and node plans do not show, e.g. plans of few long masked units:
`--pairs MANIFEST`, a JSON list of {"table": planner_ab output, "configs":
its CONFIGS_FILE, "a": [CLI options of variant A], "b": [...of B], "plans":
{"HEADS SPEC": [[units, segments, kv_bytes, partial_bytes] of A, ... of B]}
as timed}; each pair adds its difference (weight 1) and both times (0.3) to
the fit, and the report counts the pairs where auto's rule on the fitted
prices (B where predicted more than 5 % faster than A) picks a plan within
3 % of the faster. A pair whose plans the CLI no longer makes as timed (the
planner changed since) is left out and counted; `--record-plans` writes the
CLI's plans into the manifest (run it with the commit that timed them).

  fit_auto_cost.py RESULTS.json... --out data/auto_cost_h100.json
  fit_auto_cost.py RESULTS.json... --loso      # leave one suite out: fit on the others, test on it
  fit_auto_cost.py RESULTS.json... --candidates per-query,node,fasttree --loso   # what another set would do

numpy only.
"""
import argparse
import collections
import re
import datetime
import itertools
import json
import os
import subprocess
import sys

import numpy as np

FEATURES = ["const", "launches", "kv_mb", "unique_kv_mb", "partial_mb", "max_unit_kt", "kctas", "ksegments",
            "padded_gflop", "wave_kt", "masked_kt"]
PLANNERS = ["per-query", "node", "node-chunk", "flatten", "fasttree", "pat", "forge"]
PAIR_WEIGHT, ABS_WEIGHT = 1.0, 0.3


def features(r):
    """The features of one record (attached by attach_features)."""
    return r["_features"]


def attach_features(configs, planners, treeattn, sms):
    """Plans every config with each planner through `treeattn plan --json` and
    attaches its auto_features to the record, as "_features"."""
    groups = collections.defaultdict(list)  # the CLI options a config needs -> configs
    for c in configs:
        r = c[2]["node"]
        groups[(r["num_qo_heads"], r["num_kv_heads"], r["head_dim"], r["page_size"], r["dtype"])].append(c)
    for (qo, kv, d, page, dtype), group in groups.items():
        cmd = [treeattn, "plan", "--json", "--heads", f"{qo}/{kv}", "--head-dim", str(d), "--page-size", str(page),
               "--dtype", dtype, "--sms", str(sms)]
        for c in group:
            cmd += ["-w", c[1][0]]
        for p in planners:
            cmd += ["-p", p]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd[:12])} ...: {out.stderr.strip()}")
        records = json.loads(out.stdout)
        if len(records) != len(group) * len(planners):
            sys.exit(f"treeattn plan gave {len(records)} plans for {len(group)} workloads x {len(planners)} planners")
        for i, c in enumerate(group):
            for j, p in enumerate(planners):
                f = records[i * len(planners) + j]["auto_features"]
                if sorted(f) != sorted(FEATURES):
                    sys.exit(f"treeattn plan's auto_features {sorted(f)} are not this script's {sorted(FEATURES)}")
                rec = c[2][p]
                for key in ("units", "segments", "kv_bytes", "partial_bytes"):
                    if records[i * len(planners) + j][key] != rec[key]:
                        sys.exit(f"{c[1][0]} {qo}/{kv} {p}: treeattn plan's {key} {records[i * len(planners) + j][key]}"
                                 f" is not the results' {rec[key]}: plan with the commit (and --sms) of the suite run")
                rec["_features"] = np.array([f[n] for n in FEATURES])


def load(paths):
    """Configs: (suite, (workload, qo heads, kv heads), {planner: record})."""
    configs, devices = [], set()
    for path in paths:
        d = json.load(open(path))
        devices.add(d.get("device", "?"))
        g = collections.defaultdict(dict)
        for r in d["records"]:
            g[(r["workload"], r["num_qo_heads"], r["num_kv_heads"])][r["planner"]] = r
        for key, v in g.items():
            configs.append((d.get("suite", path), key, v))
    return configs, sorted(devices)


def nnls(A, b, iters=500):
    """Lawson-Hanson non-negative least squares: min |Ax - b|, x >= 0."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    w = A.T @ (b - A @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max() <= 1e-12:
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
        w = A.T @ (b - A @ x)
    return x


def load_pairs(manifest, treeattn, record=False):
    """A/B pairs: (label, features of A, of B, time of A, of B) for every config of
    each planner_ab table of the manifest, planned by `treeattn plan -p auto` with
    the variant's options (from the repository root, as the runs were), and the
    number of pairs left out because a plan differs from the one timed. With
    `record`, the plans are written into the manifest instead of checked."""
    pairs, stale = [], 0
    entries = json.load(open(manifest))
    for entry in entries:
        timed = entry.setdefault("plans", {})
        specs = [line.split(None, 1) for line in open(entry["configs"]) if line.strip() and not line.startswith("#")]
        for line in open(entry["table"]):
            m = re.match(r"^(\S+)\s+auto\s+(\d+/\d+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s", line)
            if not m:
                continue
            name, heads, ta, tb = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
            tail = name.split("/")[-1]  # the table cuts long specs at the front
            full = [sp.strip() for h, sp in specs if h == heads and sp.strip().split("/")[-1].endswith(tail)]
            if len(full) != 1:
                sys.exit(f"{entry['table']}: {heads} {name} matches {len(full)} lines of {entry['configs']}")
            f, plans = [], []
            for opts in (entry["a"], entry["b"]):
                cmd = [treeattn, "plan", "--json", "--heads", heads, "-w", full[0], "-p", "auto"] + opts
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"{' '.join(cmd)}: {out.stderr.strip()}")
                r = json.loads(out.stdout)[0]
                f.append(np.array([r["auto_features"][n] for n in FEATURES]))
                plans.append([r[k] for k in ("units", "segments", "kv_bytes", "partial_bytes")])
            label = f"{heads} {full[0]}"
            if record:
                timed[label] = plans
            elif timed.get(label) != plans:
                stale += 1
                continue
            pairs.append((label, f[0], f[1], ta, tb))
    if record:
        with open(manifest, "w") as out:
            json.dump(entries, out, indent=1)
    return pairs, stale


def pair_score(pairs, coef, margin=0.05, show=False):
    """Pairs where B (taken when predicted more than `margin` faster than A)
    or A is within 3 % of the faster of the two."""
    ok = 0
    for label, fa, fb, ta, tb in pairs:
        take_b = fb @ coef < (1 - margin) * (fa @ coef)
        good = (tb if take_b else ta) <= 1.03 * min(ta, tb)
        ok += good
        if show and not good:
            print(f"  pair {label[:70]}: predicted {fa @ coef:.1f} / {fb @ coef:.1f}, measured {ta:.1f} / {tb:.1f} us")
    return ok


def fit(configs, cands, pairs=()):
    A, b = [], []
    for _, fa, fb, ta, tb in pairs:
        A += [ABS_WEIGHT * fa / ta, ABS_WEIGHT * fb / tb, PAIR_WEIGHT * (fb - fa) / min(ta, tb)]
        b += [ABS_WEIGHT, ABS_WEIGHT, PAIR_WEIGHT * (tb - ta) / min(ta, tb)]
    for _, _, v in configs:
        f = {p: features(v[p]) for p in cands}
        t = {p: v[p]["us"] for p in cands}
        for p in cands:
            A.append(ABS_WEIGHT * f[p] / t[p])
            b.append(ABS_WEIGHT)
        for p, q in itertools.combinations(cands, 2):
            w = 1 / min(t[p], t[q])
            A.append((f[p] - f[q]) * w)
            b.append((t[p] - t[q]) * w)
    return nnls(np.array(A), np.array(b))


def choose(v, coef, cands, margin):
    """auto's rule: node unless another candidate is predicted faster by more than margin."""
    pred = {p: features(v[p]) @ coef for p in cands}
    pick = "node"
    for p in cands:
        if p != "node" and pred[p] < (1 - margin) * pred["node"] and pred[p] < pred[pick]:
            pick = p
    return pick, pred


def score(configs, coef, cands, margin, show=False):
    """(configs within 1.03 x min(node, per-query), within 5 % of the best, both, all)."""
    a = b = both = 0
    for suite, key, v in configs:
        t = {p: v[p]["us"] for p in PLANNERS if p in v}
        pick, pred = choose(v, coef, cands, margin)
        ok1 = t[pick] <= 1.03 * min(t["node"], t["per-query"])
        ok2 = t[pick] <= 1.05 * min(t.values())
        a, b, both = a + ok1, b + ok2, both + (ok1 and ok2)
        if show and not (ok1 and ok2):
            best = min(t, key=t.get)
            print(f"  {suite} {key[1]}/{key[2]} {key[0][:64]}: auto -> {pick} {t[pick]:.1f} us; node {t['node']:.1f}, "
                  f"per-query {t['per-query']:.1f}, best {best} {t[best]:.1f}"
                  f"{'' if ok1 else ' [> 1.03 x min]'}{'' if ok2 else ' [> 1.05 x best]'}")
    return a, b, both, len(configs)


def fit_with_margin(configs, cands, pairs=()):
    coef = fit(configs, cands, pairs)
    margins = [i / 100 for i in range(11)]
    margin = max(margins, key=lambda m: (score(configs, coef, cands, m)[2], -m))
    return coef, margin


def fmt(s):
    return f"{s[0]}/{s[3]} <= 1.03 x min(node, per-query), {s[1]}/{s[3]} within 5 % of the best, {s[2]}/{s[3]} both"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="results.json of `treeattn bench --suite` (one per suite)")
    ap.add_argument("--candidates", default="per-query,node", help="planners auto chooses among (node first)")
    ap.add_argument("--out", help="write the table here")
    ap.add_argument("--loso", action="store_true", help="leave one suite out: fit on the others, score on it")
    ap.add_argument("--show", action="store_true", help="list the configs that miss a criterion")
    ap.add_argument("--treeattn", default=None, help="the treeattn CLI (default: build/cpu/treeattn, build/default/treeattn)")
    ap.add_argument("--sms", type=int, default=132, help="the SM count the suites planned for (treeattn --sms)")
    ap.add_argument("--pairs", help="JSON manifest of planner_ab A/B runs of auto's variants to fit as well")
    ap.add_argument("--record-plans", action="store_true",
                    help="write the CLI's plans of the --pairs configs into the manifest and exit")
    args = ap.parse_args()
    cands = args.candidates.split(",")
    configs, devices = load(args.results)
    configs = [c for c in configs if all(p in c[2] for p in set(cands) | {"node", "per-query"})]
    treeattn = args.treeattn or next((p for p in ["build/cpu/treeattn", "build/default/treeattn"] if os.path.exists(p)),
                                     None)
    if not treeattn:
        sys.exit("no treeattn CLI found: build it or pass --treeattn")
    if args.record_plans:
        if not args.pairs:
            sys.exit("--record-plans needs --pairs")
        pairs, _ = load_pairs(args.pairs, treeattn, record=True)
        print(f"recorded the plans of {len(pairs)} pairs in {args.pairs}")
        return
    attach_features(configs, cands, treeattn, args.sms)
    pairs, stale = load_pairs(args.pairs, treeattn) if args.pairs else ([], 0)
    if stale:
        print(f"A/B pairs: {stale} left out, their plans differ from the ones timed")
    coef, margin = fit_with_margin(configs, cands, pairs)
    print("coefficients (us per unit):", ", ".join(f"{n} {c:.4g}" for n, c in zip(FEATURES, coef)), f"margin {margin}")
    print("in sample:", fmt(score(configs, coef, cands, margin, args.show)))
    if pairs:
        print(f"A/B pairs: {pair_score(pairs, coef, show=args.show)}/{len(pairs)} within 3 % of the faster")
    if args.loso:
        for held in sorted({c[0] for c in configs}):
            train = [c for c in configs if c[0] != held]
            test = [c for c in configs if c[0] == held]
            c2, m2 = fit_with_margin(train, cands, pairs)
            print(f"held out {held} (fit on the others, margin {m2}):", fmt(score(test, c2, cands, m2, args.show)))
    if args.out:
        if cands != ["per-query", "node"]:
            sys.exit("--out: the auto planner chooses between per-query and node; fit with the default --candidates")
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
        sources = sorted({f"{c[0]}" for c in configs})
        table = {
            "format": "treeattn-auto-cost/1",
            "device": ", ".join(devices),
            "date": datetime.date.today().isoformat(),
            "commit": commit,
            "source": "suites " + ", ".join(sources) + f" ({len(configs)} configs, measured at commit " +
                      ", ".join(sorted({r['commit'] for c in configs for r in c[2].values() if 'commit' in r})) + ")",
            "fit": "scripts/fit_auto_cost.py " + " ".join(args.results) +
                   (f" --pairs {args.pairs}" if args.pairs else "") + " --out " + args.out,
            "margin": margin,
            "coefficients": {n: float(f"{c:.6g}") for n, c in zip(FEATURES, coef)},
        }
        with open(args.out, "w") as f:
            f.write(to_json(table))
        print("wrote", args.out)


def to_json(t):
    """The table in the layout of the built-in copy (src/plan/planners/auto.cpp)."""
    q = json.dumps
    lines = ["{", f'  "format": {q(t["format"])},']
    for k in ["device", "date", "commit", "source", "fit"]:
        lines.append(f"  {q(k)}: {q(t[k])},")
    lines.append(f'  "margin": {t["margin"]},')
    lines.append('  "coefficients": {')
    items = list(t["coefficients"].items())
    for i, (k, v) in enumerate(items):
        lines.append(f"    {q(k)}: {v}{',' if i + 1 < len(items) else ''}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
