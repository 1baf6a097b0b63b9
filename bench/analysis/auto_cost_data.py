#!/usr/bin/env python3
"""Data for the offline study of auto's cost-model forms (bench/analysis/auto_cost_forms.py).

Loads the H100 suite results (training) and the offsuite results (held out: H100 at
9c59fb1 + 7011fd2, H200 at 0727ba0), plans every config with the CLI at HEAD
(`treeattn plan --json`, cached in bench/analysis/auto_cost_features_cache.json) and
attaches the plan's auto_features to every record whose plan the CLI still makes
identically (units, segments, kv_bytes, partial_bytes equal). An `auto` record that
HEAD's auto no longer makes is also tried against auto with the shipped table at
margin 0.99 (node's shape before auto's last step, per-query against node) and the
other planners' plans of the same config; a record matching none is dropped and
counted. Per-launch numbers come from the record's own launch_info.

numpy only. Run from the repository root.
"""
import collections
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100 = os.path.join(ROOT, "bench/results/NVIDIA_H100_80GB_HBM3")
H200 = os.path.join(ROOT, "bench/results/NVIDIA_H200")
CACHE = os.path.join(ROOT, "bench/analysis/auto_cost_features_cache.json")
CLI = os.path.join(ROOT, "build/cpu/treeattn")
FEATURES = ["const", "launches", "kv_mb", "unique_kv_mb", "partial_mb", "max_unit_kt", "kctas", "ksegments",
            "padded_gflop", "wave_kt", "masked_kt"]
KEYS = ("units", "segments", "kv_bytes", "partial_bytes")
EXTRA_KEYS = ("masked_units", "max_unit_tokens", "padded_rows")
ALL_PLANNERS = ["per-query", "node", "node-chunk", "flatten", "fasttree", "pat", "forge", "auto"]

TRAIN = [("fasttree", f"{H100}/fasttree/results.json"), ("pat", f"{H100}/pat/results.json"),
         ("deft", f"{H100}/deft/results.json"), ("flashforge", f"{H100}/flashforge/results.json"),
         ("forests", f"{H100}/forests/results.json")]
# held out: set name -> list of result files (their records of one config are pooled)
HELD = {"h100": [f"{H100}/offsuite_9c59fb1/offsuite/results.json", f"{H100}/offsuite_7011fd2/results.json"],
        "h200": [f"{H200}/offsuite_0727ba0/offsuite/results.json"]}


def family(spec):
    return spec.split(":")[0]


def parse_launch_info(info, units, kv_heads, sms=132):
    """[(m, ctas, resident, maxlen)] of the attention launches, merge queries (0: none).
    A persistent launch's grid is its resident slots; its CTAs (units x kv heads) are
    inferred: the plan's CTAs less the other launches', shared among the persistent
    launches in proportion to their slots where there are several (an estimate)."""
    launches, merge_q = [], 0
    for part in info.split("; "):
        part = part.strip()
        m = re.match(r"merge (\d+) queries", part)
        if m:
            merge_q = int(m.group(1))
            continue
        m = re.match(r"m(\d+)(?:n(\d+))? ctas=(\d+)( persistent)? stages=\d+ smem=(\d+)K maxlen=(\d+)", part)
        if not m:
            raise ValueError(f"launch_info part {part!r}")
        rows, ctas, pers, smem, maxlen = int(m.group(1)), int(m.group(3)), bool(m.group(4)), int(m.group(5)), int(m.group(6))
        resident = sms * min(8, max(1, 228 // smem))
        launches.append([rows, ctas, resident, maxlen, pers])
    total = units * kv_heads
    fixed = sum(l[1] for l in launches if not l[4])
    pers = [l for l in launches if l[4]]
    if pers:
        rest = max(total - fixed, sum(l[2] for l in pers))
        slots = sum(l[2] for l in pers)
        for l in pers:
            l[1] = max(1, round(rest * l[2] / slots))
    return [tuple(l[:4]) for l in launches], merge_q


def launch_features(rec):
    """Per-launch summaries from the record's launch_info."""
    ls, merge_q = parse_launch_info(rec["launch_info"], rec["units"], rec["num_kv_heads"])
    waves = [-(-c // r) * ml * 1e-3 for _, c, r, ml in ls]
    return {
        "attn_launches": len(ls),
        "merge": 1.0 if merge_q > 0 else 0.0,
        "merge_kq": merge_q * rec["num_qo_heads"] * 1e-3,  # merged (query, head) rows, thousands
        "wave_sum_kt": sum(waves),
        "wave_max_kt": max(waves) if waves else 0.0,
        "launch_waves": waves,
        "launch_ctas_k": [c * 1e-3 for _, c, _, _ in ls],
        "launch_rows": [m for m, _, _, _ in ls],
    }


def run_cli(heads, specs, planners, extra=()):
    cmd = [CLI, "plan", "--json", "--heads", heads, "--head-dim", "128", "--page-size", "16", "--dtype", "fp16",
           "--sms", "132"] + list(extra)
    for s in specs:
        cmd += ["-w", s]
    for p in planners:
        cmd += ["-p", p]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[:14])} ...: {out.stderr.strip()}")
    recs = json.loads(out.stdout)
    assert len(recs) == len(specs) * len(planners), (len(recs), len(specs), planners)
    res = {}
    for i, s in enumerate(specs):
        for j, p in enumerate(planners):
            r = recs[i * len(planners) + j]
            assert r["planner"] == p and r["workload"] == s, (r["planner"], r["workload"], p, s)
            res[(s, p)] = {k: r[k] for k in KEYS + EXTRA_KEYS} | {"auto_features": r["auto_features"]}
    return res


def head_of_cli():
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()


def cli_plans(needed):
    """needed: {heads: set(specs)} -> {(heads, spec, variant): plan}; variant = planner name or 'auto@keepnode'."""
    cache = json.load(open(CACHE)) if os.path.exists(CACHE) else {}
    stamp = f"{head_of_cli()} {os.path.getmtime(CLI):.0f}"
    if cache.get("_stamp") != stamp:
        cache = {"_stamp": stamp}
    keepnode = "/tmp/auto_cost_keepnode.json"
    table = json.load(open(os.path.join(ROOT, "data/auto_cost_h100.json")))
    table["margin"] = 0.99
    json.dump(table, open(keepnode, "w"))
    for heads, specs in needed.items():
        todo = sorted(s for s in specs if f"{heads}|{s}|node" not in cache)
        for i in range(0, len(todo), 40):
            chunk = todo[i:i + 40]
            for (s, p), v in run_cli(heads, chunk, ALL_PLANNERS).items():
                cache[f"{heads}|{s}|{p}"] = v
            for (s, p), v in run_cli(heads, chunk, ["auto"], ["--auto-cost", keepnode]).items():
                cache[f"{heads}|{s}|auto@keepnode"] = v
    with open(CACHE, "w") as f:
        json.dump(cache, f)
    return cache


def load_records():
    """Returns (records, drops): records are dicts with set, suite, config, planner, us, us_graph,
    f (dict of features), sig (the plan's signature), family, heads."""
    raw = []
    for suite, path in TRAIN:
        for r in json.load(open(path))["records"]:
            raw.append(("train", suite, path, r))
    for name, paths in HELD.items():
        for path in paths:
            for r in json.load(open(path))["records"]:
                raw.append((name, "offsuite", path, r))
    needed = collections.defaultdict(set)
    for _, _, _, r in raw:
        needed[f"{r['num_qo_heads']}/{r['num_kv_heads']}"].add(r["workload"])
    cache = cli_plans(needed)
    out, drops = [], collections.Counter()
    extra_diff = collections.Counter()
    for setname, suite, path, r in raw:
        heads = f"{r['num_qo_heads']}/{r['num_kv_heads']}"
        sig = tuple(r[k] for k in KEYS)
        order = [r["planner"]] + (["auto@keepnode"] + ALL_PLANNERS if r["planner"] == "auto" else [])
        match = None
        for v in order:
            p = cache[f"{heads}|{r['workload']}|{v}"]
            if tuple(p[k] for k in KEYS) == sig:
                match = (v, p)
                break
        tag = f"{setname}/{os.path.relpath(path, ROOT).split('/')[3]}/{r['planner']}"
        if match is None:
            drops[tag] += 1
            continue
        v, p = match
        if any(p[k] != r[k] for k in EXTRA_KEYS):
            extra_diff[tag] += 1
        f = dict(p["auto_features"])
        f.update({k: v2 for k, v2 in launch_features(r).items()})
        out.append({"set": setname, "suite": suite, "source": os.path.relpath(path, ROOT), "planner": r["planner"],
                    "matched_as": v, "config": (r["workload"], heads), "heads": heads, "family": family(r["workload"]),
                    "us": r["us"], "us_graph": r["us_graph"], "f": f, "sig": sig,
                    "record_launches": r["launches"]})
    return out, drops, extra_diff


if __name__ == "__main__":
    recs, drops, extra = load_records()
    c = collections.Counter((r["set"], r["suite"], r["planner"], r["matched_as"]) for r in recs)
    for k in sorted(c):
        print(k, c[k])
    print("dropped:", dict(drops))
    print("matched on the 4 keys but differing in masked_units/max_unit_tokens/padded_rows:", dict(extra))
    bad = sum(r["f"]["launches"] != r["record_launches"] for r in recs)
    print("records whose CLI launches feature != the record's launches:", bad)
