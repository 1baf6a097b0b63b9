#!/usr/bin/env python3
"""Does a simulated makespan of each launch's CTAs give auto's cost model the feature it lacks?

Issue 21 goal 1: auto within 1.03x of min(per-query, node) on every config, off the suites too. Earlier
studies (auto_cost_forms.py: eight non-linear forms of the same features; zoo_decisions.py: a zoo of 18 plans
per offsuite config on an H200) found no better form; the guess tested here is a missing feature: the
makespan of a launch's CTAs over the GPU's CTA slots (a few-shot miss had 288 CTAs on 264 slots, 1.09 waves,
which a linear sum of bytes cannot see).

Per plan, the launches are those the CUDA executor makes (plan_units_dump.cpp, built here against
build/cpu/libtreeattn.a: units grouped by tile, m16n64 -> m16n32 where all such units have <= 32 tokens,
longest first; choose_stages' stages and CTAs per SM, checked against the timed records' launch_info;
persistent launches). Each launch's (unit, kv head) items are list-scheduled in that order onto its slots
(132 SMs x CTAs per SM), an item costing c0 + ceil(tokens / n) * n * (1 + rho * m / 128) token-equivalents
(c0: a CTA's fixed cost; rho: a 128-row tile's extra time per token), for c0 in C0S and rho in RHOS. From
those, per plan (kilo-token-equivalents; S = a launch's slots, W = its items' summed cost):
  ms        sum over launches of the makespan (exact list scheduling)
  ms_auto   the same over auto's own resident-CTA estimate (auto.cpp resident_ctas) instead of choose_stages'
  msmax     the largest launch makespan (the launches of a chained run overlap: between msmax and ms)
  tail      sum over launches of makespan - W / S (the idle slots' share)
  waves     sum over launches of ceil(items / S) x the longest item's cost (waves x max CTA cost)
  fluid     sum over launches of max(longest item, W / S) (no simulation, no tail)
  lpt       sum over launches of the longest item if items <= S, else max(longest, W / S + shortest x (1 - 1/S)):
            list scheduling's bound, O(units) without sorting; lpt_auto: the same over auto's resident_ctas
  maxlen    sum over launches of the longest item's cost (no slots at all)
Variants: the shipped table as is (launches + merge, as auto's final node / per-query choice; and with the
attention launches only, as the CLI's features); its features + merge refitted (the control); the control
plus one makespan feature (+ms, +ms_auto, +tail, +fluid, +lpt, +lpt_auto, +maxlen, +ms+msmax) or with one
replaced (ms-wave: ms for wave_kt and max_unit_kt; ms-kv: ms for kv_mb; +waves: waves for wave_kt). Each is
non-negative linear, fitted two ways, (c0, rho) by the least fit loss:
  nnls3  as the shipped table (scripts/fit_auto_cost.py): fasttree, pat, deft, the plans of node and per-query;
         NNLS on each plan's time relative to itself (weight 0.3) and every two plans' difference relative to
         the faster (weight 1);
  log5   as auto_cost_forms.py's linear-log: the five H100 suites fasttree, pat, deft, flashforge, forests, the
         distinct plans of auto, node and per-query; the same rows in log space, coefficients >= 0.
(auto_cost_data.py matches the suites' records, bench/results/NVIDIA_H100_80GB_HBM3/*/, to HEAD's plans.)
Scored (a model picks the plan it predicts fastest among the candidates, margin 0):
  suites crit1 / crit2: the 201 configs of fasttree, pat, deft, flashforge (in sample; forests apart): pick
    among auto / node / per-query within 1.03x of min(node, per-query) / within 5 % of the best of the 8
    planners timed;
  offsuite H100 (node, per-query 9c59fb1, auto 7011fd2) and H200 (0727ba0) crit1, held out;
  zoo (bench/results/NVIDIA_H200/offsuite_zoo_9e3d764, 18 plans per offsuite config, H200): crit1 and crit2
    (within 5 % of the best of the zoo) picking among auto / node / per-query (zoo3), and among all 18 (zoo18).
A bootstrap over the training configs (--boot) checks that a variant's held-out gain over the control is not
one fit's luck; the dumper's time mode prices the makespan against auto's planning time.
Needs numpy, scipy (the log-space fit), build/cpu/treeattn and build/cpu/libtreeattn.a (a c++20 compiler builds the dumper once, into
/tmp). Run from the repository root:
  python3 bench/analysis/auto_cost_makespan.py [--out bench/analysis/auto_cost_makespan_results.txt]
"""
import argparse
import collections
import datetime
import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import auto_cost_data as D  # noqa: E402

ROOT = D.ROOT
# scripts/fit_auto_cost.py's Lawson-Hanson non-negative least squares, loaded from the script.
_spec = importlib.util.spec_from_file_location("fit_auto_cost", os.path.join(ROOT, "scripts/fit_auto_cost.py"))
_fac = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fac)
nnls = _fac.nnls
SRC = os.path.join(ROOT, "bench/analysis/plan_units_dump.cpp")
LIB = os.path.join(ROOT, "build/cpu/libtreeattn.a")
TOOL = "/tmp/treeattn_plan_makespan"
CACHE = "/tmp/treeattn_plan_makespan_cache.json"
ZOO = os.path.join(ROOT, "bench/results/NVIDIA_H200/offsuite_zoo_9e3d764")
C0S = [0, 32, 64, 128, 256, 512]
RHOS = [0, 1]
SETTINGS = [(c0, rho) for rho in RHOS for c0 in C0S]  # the tool's order: rho outer, c0 inner
SHIPPED = {"const": 0.707341, "launches": 7.611, "kv_mb": 0.12194, "unique_kv_mb": 0.170269, "partial_mb": 0.554255,
           "max_unit_kt": 7.12092, "kctas": 6.34676, "ksegments": 0.209556, "padded_gflop": 0.0, "wave_kt": 2.47109,
           "masked_kt": 0.0}
BASE = D.FEATURES + ["merge"]
SUITES4 = ("fasttree", "pat", "deft", "flashforge")
DECIDERS = ("auto", "node", "per-query")
ABS_W, PAIR_W = 0.3, 1.0


# ------------------------------------------------------------------ plans and launches -----------------------------

def build_tool():
    if os.path.exists(TOOL) and os.path.getmtime(TOOL) > max(os.path.getmtime(SRC), os.path.getmtime(LIB)):
        return
    subprocess.run(["nice", "c++", "-O2", "-std=c++20", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src"),
                    SRC, LIB, "-o", TOOL], check=True, cwd=ROOT)


def dump(requests):
    """requests: set of (heads, variant, opts, spec) -> {request: the tool's JSON}."""
    build_tool()
    stamp = f"{os.path.getmtime(TOOL):.0f} {C0S} {RHOS}"
    cache = json.load(open(CACHE)) if os.path.exists(CACHE) else {}
    if cache.get("_stamp") != stamp:
        cache = {"_stamp": stamp}
    todo = sorted(r for r in requests if "\t".join(r) not in cache)
    if todo:
        inp = "".join("\t".join(r) + "\n" for r in todo)
        out = subprocess.run([TOOL, ",".join(map(str, C0S)), ",".join(map(str, RHOS))], input=inp, capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout.splitlines()
        assert len(out) == len(todo), (len(out), len(todo))
        for r, line in zip(todo, out):
            cache["\t".join(r)] = json.loads(line)
        json.dump(cache, open(CACHE, "w"))
    return {r: cache["\t".join(r)] for r in requests}


def launch_info_check(rec, plan):
    """The record's launch_info against the tool's launches: (launches agree, per-launch fields agree)."""
    parts = [p for p in rec["launch_info"].split("; ") if not p.startswith("merge")]
    got = []
    for part in parts:
        m = re.match(r"m(\d+)(?:n(\d+))? ctas=(\d+)( persistent)? stages=(\d+) smem=(\d+)K maxlen=(\d+)", part)
        got.append((int(m.group(1)), int(m.group(2) or 64), int(m.group(3)), bool(m.group(4)), int(m.group(5)),
                    int(m.group(6)), int(m.group(7))))
    mine = [(l["m"], l["n"], l["per_sm"] * 132 if l["persistent"] else l["items"], l["persistent"], l["stages"],
             l["smem_k"], l["max_len"]) for l in plan["launches"]]
    return sorted(got) == sorted(mine), got, mine


def makespan_features(plan, k):
    """The makespan features of setting k (kilo-token-equivalents)."""
    c0, rho = SETTINGS[k]
    ms = [l["ms"][k] for l in plan["launches"]]
    cost = lambda l, t: c0 + math.ceil(t / l["n"]) * l["n"] * (1 + rho * l["m"] / 128)
    f = {"ms": sum(ms), "msmax": max(ms, default=0), "ms_auto": sum(l["ms_auto"][k] for l in plan["launches"]),
         "tail": 0.0, "waves": 0.0, "maxlen": 0.0, "fluid": 0.0, "lpt": 0.0, "lpt_auto": 0.0}
    for l in plan["launches"]:
        S = 132 * l["per_sm"]
        dmax, dmin, W = cost(l, l["max_len"]), cost(l, l["min_len"]), l["work"][k]
        f["tail"] += l["ms"][k] - W / S
        f["waves"] += math.ceil(l["items"] / S) * dmax
        f["maxlen"] += dmax
        f["fluid"] += max(dmax, W / S)
        f["lpt"] += dmax if l["items"] <= S else max(dmax, W / S + dmin * (1 - 1 / S))
        Sa = 132 * l["per_sm_auto"]
        f["lpt_auto"] += dmax if l["items"] <= Sa else max(dmax, W / Sa + dmin * (1 - 1 / Sa))
    return {n: v * 1e-3 for n, v in f.items()}


def zoo_variants():
    v = {"auto": ("auto", "-"), "per-query": ("per-query", "-"), "node": ("node", "-")}
    for line in open(os.path.join(ROOT, "bench/analysis/device_offsuite_zoo.sh")):
        for m in re.finditer(r'"(node_[a-z0-9_]+)\|node\|([^"]*)"', line):
            v[m.group(1)] = ("node", m.group(2) or "-")
    return v


# ------------------------------------------------------------------ models ----------------------------------------

def fit(groups, names, feat, how):
    """groups: [[(plan, time), ...] per config]; feat(plan) -> dict; (coef, loss).
    how "nnls": as scripts/fit_auto_cost.fit (NNLS on each plan's time relative to itself, weight 0.3, and every
    two plans' difference relative to the faster, weight 1); "log": the same rows in log space (log predicted -
    log measured, weight 0.3; its difference between two plans of a config, weight 1), coefficients >= 0
    (scipy least_squares, from the NNLS solution), as auto_cost_forms.py's linear-log."""
    A, b, X, T, pairs = [], [], [], [], []
    for g in groups:
        i0 = len(X)
        for p, t in g:
            X.append(np.array([feat(p)[n] for n in names]))
            T.append(t)
        for i, j in itertools.combinations(range(i0, len(X)), 2):
            pairs.append((i, j))
    X, T = np.array(X), np.array(T)
    A = np.concatenate([ABS_W * X / T[:, None]] + ([PAIR_W * (X[[i for i, _ in pairs]] - X[[j for _, j in pairs]]) /
                                                     np.minimum(T[[i for i, _ in pairs]], T[[j for _, j in pairs]])[:, None]]
                                                    if pairs else []))
    b = np.concatenate([np.full(len(T), ABS_W)] + ([PAIR_W * (T[[i for i, _ in pairs]] - T[[j for _, j in pairs]]) /
                                                    np.minimum(T[[i for i, _ in pairs]], T[[j for _, j in pairs]])]
                                                   if pairs else []))
    c = nnls(A, b)
    if how == "nnls":
        r = A @ c - b
        return dict(zip(names, c)), float(r @ r)
    from scipy.optimize import least_squares
    P = np.array(pairs).reshape(-1, 2)
    lt = np.log(T)

    def res(x):
        d = np.log(np.maximum(X @ x, 1e-3)) - lt
        return np.concatenate([ABS_W * d, PAIR_W * (d[P[:, 0]] - d[P[:, 1]])])

    def jac(x):
        J = X / np.maximum(X @ x, 1e-3)[:, None]
        return np.concatenate([ABS_W * J, PAIR_W * (J[P[:, 0]] - J[P[:, 1]])])
    x0 = np.maximum(c, 1e-3)
    sol = least_squares(res, x0, jac=jac, bounds=(0, np.inf), method="trf", x_scale="jac", max_nfev=2000)
    x = np.where(sol.x < 1e-9, 0, sol.x)
    r = res(x)
    return dict(zip(names, x)), float(r @ r)


class Model:
    def __init__(self, name, names, extra, desc):
        self.name, self.names, self.extra, self.desc = name, names, extra, desc
        self.coef, self.k, self.loss = None, None, None

    def feat(self, plan, k=None):
        k = self.k if k is None else k
        f = dict(plan["base"])
        if self.extra:
            f.update(plan["mk"][k])
        return f

    def predict(self, plan):
        f = self.feat(plan)
        return sum(c * f[n] for n, c in self.coef.items())


# ------------------------------------------------------------------ main ------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/analysis/auto_cost_makespan_results.txt"))
    ap.add_argument("--train-planners", default="deciders", choices=["deciders", "all"],
                    help="fit on the distinct plans of auto/node/per-query (default) or of all eight planners")
    ap.add_argument("--boot", type=int, default=20, help="bootstrap resamples of the training configs (0: none)")
    args = ap.parse_args()
    lines = []
    out = lines.append

    recs, drops, _ = D.load_records()
    keepnode = "/tmp/auto_cost_keepnode.json"  # auto_cost_data's table for auto records matched at margin 0.99
    variant = lambda r: ("auto@" + keepnode) if r["matched_as"] == "auto@keepnode" else r["matched_as"]
    req = {(r["heads"], variant(r), "-", r["config"][0]) for r in recs}
    V = zoo_variants()
    specs = [l.strip().lstrip("+") for l in open(os.path.join(ROOT, "data/suites/offsuite.suite"))
             if ":" in l and not l.startswith("#") and not re.match(r"^(quick_)?heads:|^head_dim:|^dtype:|^page_size:", l)]
    zoo_recs = []
    for v in sorted(os.listdir(ZOO)):
        if v in V:
            for x in json.load(open(os.path.join(ZOO, v, "results.json")))["records"]:
                zoo_recs.append((v, x))
                req.add((f"{x['num_qo_heads']}/{x['num_kv_heads']}", V[v][0], V[v][1], x["workload"]))
    P = dump(req)
    bad = [k for k, p in P.items() if "error" in p]
    assert not bad, bad[:3]

    # Every record against the tool's plan: the four keys, the CLI's features, the launches.
    agree = collections.Counter()
    for r in recs:
        p = P[(r["heads"], variant(r), "-", r["config"][0])]
        assert tuple(p[k] for k in D.KEYS) == r["sig"], (r["config"], r["planner"])
        assert all(abs(p["f"][n] - r["f"][n]) <= 1e-6 * max(1, abs(r["f"][n])) for n in D.FEATURES), (r["config"], r["planner"])
    raw = {}
    for setname, suite, path, r in _raw_records():
        raw.setdefault((r["workload"], f"{r['num_qo_heads']}/{r['num_kv_heads']}", r["planner"], path), r)
    for r in recs:
        x = raw[(r["config"][0], r["heads"], r["planner"], os.path.join(ROOT, r["source"]))]
        ok, _, _ = launch_info_check(x, P[(r["heads"], variant(r), "-", r["config"][0])])
        agree[(r["set"], ok)] += 1
    zoo_drop = collections.Counter()
    ZT, ZP = collections.defaultdict(dict), collections.defaultdict(dict)
    for v, x in zoo_recs:
        h = f"{x['num_qo_heads']}/{x['num_kv_heads']}"
        p = P[(h, V[v][0], V[v][1], x["workload"])]
        if any(p[k] != x[k] for k in D.KEYS):
            zoo_drop[v] += 1
            continue
        ok, _, _ = launch_info_check(x, p)
        agree[("zoo", ok)] += 1
        ZT[(x["workload"], h)][v], ZP[(x["workload"], h)][v] = x["us"], p

    # Per plan: base features (+ merge) and the makespan features of every setting.
    def prep(p):
        if "base" not in p:
            p["base"] = dict(p["f"]) | {"merge": 1.0 if p["slots"] > 0 else 0.0}
            p["mk"] = [makespan_features(p, k) for k in range(len(SETTINGS))]
        return p

    for p in P.values():
        prep(p)

    # Distinct plans per (set, config), time = geomean of its records (auto_cost_forms' rule for the deciders).
    G = collections.OrderedDict()
    for r in recs:
        if not r["us"] > 0:
            continue
        G.setdefault((r["set"], r["suite"], r["config"], r["sig"]), []).append(r)
    plans = []
    for (setname, suite, config, sig), rs in G.items():
        decider = any(r["planner"] in DECIDERS and not (setname == "h100" and r["planner"] == "auto" and "7011fd2" not in r["source"])
                      for r in rs)
        plans.append({"set": setname, "suite": suite, "config": config, "planners": {r["planner"] for r in rs},
                      "decider": decider, "t": float(np.exp(np.mean([np.log(r["us"]) for r in rs]))),
                      "p": P[(rs[0]["heads"], variant(rs[0]), "-", config[0])]})
    by_cfg = collections.defaultdict(list)
    for q in plans:
        by_cfg[(q["set"], q["suite"], q["config"])].append(q)
    best_all = collections.defaultdict(lambda: float("inf"))  # the suites' best planner (crit2)
    for r in recs:
        if r["us"] > 0:
            best_all[(r["set"], r["suite"], r["config"])] = min(best_all[(r["set"], r["suite"], r["config"])], r["us"])

    # Training sets: "nnls3" as the shipped table was fitted (fasttree, pat, deft; the plans of node and
    # per-query; NNLS), "log5" as auto_cost_forms.py's linear-log (the five suites; auto, node, per-query; log space).
    def groups_of(suites, planners):
        gs = []
        for key, qs in by_cfg.items():
            if key[0] != "train" or key[1] not in suites:
                continue
            g = [(q["p"], q["t"]) for q in qs if args.train_planners == "all" or q["planners"] & set(planners)]
            if g:
                gs.append(g)
        return gs
    FITS = {"nnls3": (groups_of(("fasttree", "pat", "deft"), ("node", "per-query")), "nnls"),
            "log5": (groups_of(("fasttree", "pat", "deft", "flashforge", "forests"), DECIDERS), "log")}

    # Models.
    def without(*names):
        return [n for n in BASE if n not in names]
    specs_m = [
        ("refit", BASE, False, "shipped features + merge, refitted (the control)"),
        ("+ms", BASE + ["ms"], True, "refit + ms"),
        ("ms-wave", without("wave_kt", "max_unit_kt") + ["ms"], True, "refit less wave_kt, max_unit_kt, + ms"),
        ("ms-kv", without("kv_mb") + ["ms"], True, "refit less kv_mb, + ms"),
        ("+waves", without("wave_kt") + ["waves"], True, "refit less wave_kt, + waves (waves x max CTA cost)"),
        ("+tail", BASE + ["tail"], True, "refit + tail (makespan - work / slots)"),
        ("+ms+msmax", BASE + ["ms", "msmax"], True, "refit + ms + msmax (overlapping launches)"),
        ("+ms_auto", BASE + ["ms_auto"], True, "refit + ms over auto's own resident-CTA estimate (resident_ctas)"),
        ("+fluid", BASE + ["fluid"], True, "refit + sum over launches of max(longest item, work / slots) (no simulation)"),
        ("+lpt", BASE + ["lpt"], True, "refit + sum over launches of max(longest, work / slots + shortest x (1 - 1/slots))"),
        ("+lpt_auto", BASE + ["lpt_auto"], True, "+lpt over auto's own resident-CTA estimate (O(units), no sort)"),
        ("+maxlen", BASE + ["maxlen"], True, "refit + sum over launches of the longest item's cost (no slots at all)"),
    ]
    models = []
    shipped = Model("shipped", BASE, False, "data/auto_cost_h100.json, launches + merge")
    shipped.coef = dict(SHIPPED) | {"launches": SHIPPED["launches"]}
    shipped.coef["merge"] = SHIPPED["launches"]  # auto's final comparison counts the merge kernel as a launch
    shipped_plain = Model("shipped-attn", BASE, False, "data/auto_cost_h100.json, attention launches only (the CLI's features)")
    shipped_plain.coef = dict(SHIPPED)
    models += [shipped, shipped_plain]
    for fit_name, (groups, how) in FITS.items():
        for name, names, extra, desc in specs_m:
            m = Model(f"{fit_name} {name}", names, extra, desc)
            m.fit_name = fit_name
            best = None
            for k in (range(len(SETTINGS)) if extra else [0]):
                coef, loss = fit(groups, names, lambda p, k=k: m.feat(p, k), how)
                if best is None or loss < best[1]:
                    best = (coef, loss, k)
            m.coef, m.loss, m.k = best
            models.append(m)

    # Scoring.
    def score(m):
        res = {}
        # suites (in sample) and forests
        for label, suites in (("suites", SUITES4), ("forests", ("forests",))):
            c1 = c2 = n = 0
            miss = []
            for key, qs in by_cfg.items():
                if key[0] != "train" or key[1] not in suites:
                    continue
                cand = [q for q in qs if q["decider"]]
                t = {pl: q["t"] for q in qs for pl in q["planners"]}
                pick = min(cand, key=lambda q: m.predict(q["p"]))
                ok1 = pick["t"] <= 1.03 * min(t["node"], t["per-query"])
                ok2 = pick["t"] <= 1.05 * best_all[key]
                c1, c2, n = c1 + ok1, c2 + ok2, n + 1
                if not ok1:
                    miss.append(key[2])
            res[label] = (c1, c2, n, miss)
        for hs in ("h100", "h200"):
            c1 = n = 0
            miss, ratio = [], []
            for key, qs in by_cfg.items():
                if key[0] != hs:
                    continue
                cand = [q for q in qs if q["decider"]]
                tn = min(q["t"] for q in qs if "node" in q["planners"])
                tp = min(q["t"] for q in qs if "per-query" in q["planners"])
                pick = min(cand, key=lambda q: m.predict(q["p"]))
                ok = pick["t"] <= 1.03 * min(tn, tp)
                ratio.append(pick["t"] / min(tn, tp))
                c1, n = c1 + ok, n + 1
                if not ok:
                    miss.append(key[2])
            res[hs] = (c1, n, miss, float(np.exp(np.mean(np.log(ratio)))), max(ratio))
        for label, cands in (("zoo3", DECIDERS), ("zooall", None)):
            c1 = c2 = n = 0
            miss1 = []
            for key, t in ZT.items():
                if not all(v in t for v in DECIDERS):
                    continue
                cs = [v for v in t if cands is None or v in cands]
                pick = min(cs, key=lambda v: m.predict(ZP[key][v]))
                ok1 = t[pick] <= 1.03 * min(t["node"], t["per-query"])
                ok2 = t[pick] <= 1.05 * min(t.values())
                c1, c2, n = c1 + ok1, c2 + ok2, n + 1
                if not ok1:
                    miss1.append(key)
            res[label] = (c1, c2, n, miss1)
        return res

    results = {m.name: score(m) for m in models}
    # The timed auto plan as is (no model): what the suites' numbers in the docs count.
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    out(f"# auto cost model with a simulated makespan feature, offline; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%MZ};"
        f" plans of commit {head} (build/cpu); command: python3 bench/analysis/auto_cost_makespan.py {' '.join(sys.argv[1:])}")
    out(f"records matched to HEAD's plans: {len(recs)} (dropped {sum(drops.values())}); zoo records {sum(len(v) for v in ZT.values())}"
        f" (dropped, plan no longer made as timed: {sum(zoo_drop.values())} {dict(zoo_drop)})")
    out("launches as the executor makes them (the dumper's replica) agree with the records' launch_info: " +
        ", ".join(f"{s} {agree[(s, True)]}/{agree[(s, True)] + agree[(s, False)]}" for s in ("train", "h100", "h200", "zoo")))
    out("training: " + "; ".join(f"{n}: {len(g)} configs, {sum(len(x) for x in g)} plans ({how})" for n, (g, how) in FITS.items()) +
        f"; settings (c0 tokens, rho): {SETTINGS}")
    out("")
    out("## models (coefficients; us per feature unit; makespan features in kilo-token-equivalents)")
    for m in models:
        s = f"  {m.name}: {m.desc}"
        if m.extra:
            s += f"; setting c0={SETTINGS[m.k][0]} rho={SETTINGS[m.k][1]}"
        if m.loss is not None:
            s += f"; fit loss {m.loss:.3f}"
        out(s)
        out("     " + ", ".join(f"{n} {v:.4g}" for n, v in m.coef.items() if v))
    out("")
    out("## decisions (configs meeting the criterion / configs)")
    out(f"{'model':<20}{'suites c1':>11}{'suites c2':>11}{'forests c1':>11}{'H100 c1':>9}{'H200 c1':>9}"
        f"{'zoo3 c1':>9}{'zoo3 c2':>9}{'zoo18 c1':>9}{'zoo18 c2':>9}  H100 / H200: geomean, worst of pick / min(node, per-query)")
    for m in models:
        r = results[m.name]
        out(f"{m.name:<20}{r['suites'][0]:>7}/{r['suites'][2]:<3}{r['suites'][1]:>7}/{r['suites'][2]:<3}"
            f"{r['forests'][0]:>7}/{r['forests'][2]:<3}{r['h100'][0]:>5}/{r['h100'][1]:<3}{r['h200'][0]:>5}/{r['h200'][1]:<3}"
            f"{r['zoo3'][0]:>5}/{r['zoo3'][2]:<3}{r['zoo3'][1]:>5}/{r['zoo3'][2]:<3}{r['zooall'][0]:>5}/{r['zooall'][2]:<3}"
            f"{r['zooall'][1]:>5}/{r['zooall'][2]:<3}  {r['h100'][3]:.4f} {r['h100'][4]:.2f} / {r['h200'][3]:.4f} {r['h200'][4]:.2f}")
    # every setting of each makespan variant (is the choice of (c0, rho) what decides?)
    out("")
    out("## held-out crit1 (H100 / H200 / zoo3) and suites crit1 / crit2 at every setting, per makespan variant")
    for fit_name, (groups, how) in FITS.items():
        for name, names, extra, desc in specs_m:
            if not extra:
                continue
            row = []
            for k in range(len(SETTINGS)):
                m = Model(name, names, extra, desc)
                m.coef, m.loss = fit(groups, names, lambda p, k=k: m.feat(p, k), how)
                m.k = k
                r = score(m)
                row.append(f"({SETTINGS[k][0]},{SETTINGS[k][1]}) {r['h100'][0]}/{r['h200'][0]}/{r['zoo3'][0]} "
                           f"s{r['suites'][0]}/{r['suites'][1]} L{m.loss:.2f}")
            out(f"  {fit_name} {name}: " + "; ".join(row))
    out("")
    out(f"## bootstrap: log5 fits on {args.boot} resamples of the training configs (with replacement); per variant at its"
        " setting above: mean held-out crit1 H100 / H200 / zoo3, suites crit1 / crit2, and in how many resamples the"
        " variant beats log5 refit on held-out crit1 (H100 + H200 + zoo3) by >= 3 / loses")
    rng = np.random.default_rng(1)
    groups5, how5 = FITS["log5"]
    boot_names = ["refit", "+ms", "ms-wave", "+lpt", "+lpt_auto", "+tail", "+ms_auto"]
    chosen = {m.name.split(" ", 1)[1]: m for m in models if m.name.startswith("log5 ")}
    tallies = collections.defaultdict(list)
    for _ in range(args.boot):
        sample = [groups5[i] for i in rng.integers(0, len(groups5), len(groups5))]
        for name in boot_names:
            base_m = chosen[name]
            m = Model(name, base_m.names, base_m.extra, base_m.desc)
            m.k = base_m.k
            m.coef, m.loss = fit(sample, m.names, lambda p, m=m: m.feat(p), how5)
            r = score(m)
            tallies[name].append((r["h100"][0], r["h200"][0], r["zoo3"][0], r["suites"][0], r["suites"][1]))
    ref = np.array(tallies["refit"])
    for name in boot_names:
        a = np.array(tallies[name])
        d = a[:, :3].sum(1) - ref[:, :3].sum(1)
        out(f"  {name:<10} " + " / ".join(f"{v:.1f}" for v in a.mean(0)[:3]) + f"; suites {a.mean(0)[3]:.1f} / {a.mean(0)[4]:.1f}"
            f"; held-out sum vs refit {d.mean():+.1f} (>= +3 in {int((d >= 3).sum())}, < 0 in {int((d < 0).sum())} of {len(d)})")
    out("")
    out("## misses against shipped (held-out crit1): fixed (-) and new (+)")
    sh = results["shipped"]
    short = lambda c: f"{c[0].replace(ROOT + '/data/workloads/', '')[:60]}@{c[1]}"
    for m in models[1:]:
        r = results[m.name]
        for hs, i in (("h100", 2), ("h200", 2), ("zoo3", 3)):
            a, b = set(sh[hs][i]), set(r[hs][i])
            out(f"  {m.name} {hs}: -[{', '.join(short(c) for c in sorted(a - b))}] +[{', '.join(short(c) for c in sorted(b - a))}]")
    out("")
    out("## shipped's held-out misses: measured us / shipped / best makespan model per candidate, and the makespan features")
    best_m = max(models[2:], key=lambda m: results[m.name]["h100"][0] + results[m.name]["h200"][0] + results[m.name]["zoo3"][0])
    for hs in ("h100", "h200"):
        for c in sorted(set(sh[hs][2])):
            out(f"  {hs} {short(c)}")
            for q in by_cfg[(hs, "offsuite", c)]:
                if not q["decider"]:
                    continue
                p = q["p"]
                lsum = "; ".join(f"m{l['m']}n{l['n']} {l['items']} items/{132 * l['per_sm']} slots maxlen {l['max_len']}" for l in p["launches"])
                mk = p["mk"][best_m.k] if best_m.extra else p["mk"][0]
                out(f"     {'+'.join(sorted(q['planners'])):<22} {q['t']:7.1f} | {shipped.predict(p):7.1f} {best_m.predict(p):7.1f}"
                    f" | ms {mk['ms']:.2f} tail {mk['tail']:.2f} waves {mk['waves']:.2f} | {lsum}")
    out(f"  (best makespan model by held-out crit1: {best_m.name})")
    out("")
    out("## planning cost (plan_units_dump.cpp time mode, this machine, one core): exact list scheduling vs the O(units) bound")
    for nodes in (100, 1000, 10000):
        r = subprocess.run([TOOL, "time", str(nodes)], capture_output=True, text=True, cwd=ROOT)
        out("  " + r.stdout.strip())
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


def _raw_records():
    for suite, path in D.TRAIN:
        for r in json.load(open(path))["records"]:
            yield "train", suite, path, r
    for name, paths in D.HELD.items():
        for path in paths:
            for r in json.load(open(path))["records"]:
                yield name, "offsuite", path, r


if __name__ == "__main__":
    main()
