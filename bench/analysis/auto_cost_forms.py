#!/usr/bin/env python3
"""Offline test of cost-model forms for the `auto` planner (linear vs overlap forms).

  python3 bench/analysis/auto_cost_forms.py            # writes bench/analysis/auto_cost_forms_results.txt
  python3 bench/analysis/auto_cost_forms.py --time us_graph --out /tmp/x.txt

Training: the H100 suites fasttree, pat, deft, flashforge, forests (bench/results/NVIDIA_H100_80GB_HBM3/*/).
Held out: offsuite on the H100 (node, per-query at 9c59fb1; auto re-timed at 7011fd2) and on the H200 (0727ba0).
Features: auto_cost_data.py (the CLI at HEAD, cached; per-launch numbers from the records' launch_info).

Every model is scored on the same things:
  * per plan |relative error| (median, 90th percentile) over the distinct plans of a set (a plan timed twice:
    the geomean of its times); on the H200 after one scale factor (the median of log(measured / predicted)).
  * decisions: per config, among the timed plans of auto, node and per-query (distinct plans; on the H100 the
    auto plan HEAD makes, timed at 7011fd2), is the predicted-fastest one within 1.03x of the measured fastest?
numpy only.
"""
import argparse
import collections
import datetime
import importlib.util
import itertools
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import auto_cost_data as D  # noqa: E402

ROOT = D.ROOT
spec = importlib.util.spec_from_file_location("fit_auto_cost", os.path.join(ROOT, "scripts/fit_auto_cost.py"))
FAC = importlib.util.module_from_spec(spec)
spec.loader.exec_module(FAC)
assert FAC.FEATURES == D.FEATURES
DECIDERS = ("auto", "node", "per-query")
SHIPPED = {"const": 0.707341, "launches": 7.611, "kv_mb": 0.12194, "unique_kv_mb": 0.170269, "partial_mb": 0.554255,
           "max_unit_kt": 7.12092, "kctas": 6.34676, "ksegments": 0.209556, "padded_gflop": 0.0, "wave_kt": 2.47109,
           "masked_kt": 0.0}
MAXL = 8  # attention launches per plan, at most (7 seen)


# ---------------------------------------------------------------- plans ----------------------------------------------

def build_plans(recs, time_key):
    """Distinct plans per (set, config): time = geomean of the records timing it."""
    g = collections.OrderedDict()
    for r in recs:
        if not r[time_key] > 0:  # a record without this time (us_graph 0): left out
            continue
        k = (r["set"], r["suite"], r["config"], r["sig"])
        g.setdefault(k, []).append(r)
    plans = []
    for (setname, suite, config, sig), rs in g.items():
        # decision candidates: auto / node / per-query as timed; on the H100 auto only as HEAD plans it (7011fd2)
        decider = False
        for r in rs:
            if r["planner"] not in DECIDERS:
                continue
            if setname == "h100" and r["planner"] == "auto" and "7011fd2" not in r["source"]:
                continue
            decider = True
        plans.append({"set": setname, "suite": suite, "config": config, "heads": rs[0]["heads"],
                      "family": rs[0]["family"], "f": rs[0]["f"], "decider": decider,
                      "planners": sorted({r["planner"] for r in rs}),
                      "t": float(np.exp(np.mean([np.log(r[time_key]) for r in rs])))})
    return plans


def matrix(plans):
    X = {n: np.array([p["f"][n] for p in plans], float) for n in
         D.FEATURES + ["attn_launches", "merge", "merge_kq", "wave_sum_kt", "wave_max_kt"]}
    W = np.zeros((len(plans), MAXL))
    C = np.zeros((len(plans), MAXL))
    M = np.zeros((len(plans), MAXL), bool)
    R = np.zeros((len(plans), MAXL))
    for i, p in enumerate(plans):
        w, c = p["f"]["launch_waves"], p["f"]["launch_ctas_k"]
        W[i, :len(w)], C[i, :len(c)], M[i, :len(w)] = w, c, True
        R[i, :len(w)] = np.array(p["f"]["launch_rows"]) / 128
    X["W"], X["C"], X["M"], X["R"] = W, C, M, R
    X["F"] = np.stack([X[n] for n in D.FEATURES], 1)
    return X


# ---------------------------------------------------------------- models ---------------------------------------------

def pnorm(parts, p):
    parts = [np.maximum(q, 0) for q in parts]
    m = np.maximum.reduce(parts) + 1e-12
    return m * sum((q / m) ** p for q in parts) ** (1 / p)


BYTES = ["kv_mb", "unique_kv_mb", "partial_mb"]
TILES = ["wave_kt", "max_unit_kt", "kctas", "ksegments", "padded_gflop", "masked_kt"]


class Model:
    def __init__(self, name, params, fn, desc, bounds=None):
        self.name, self.params, self.fn, self.desc = name, params, fn, desc
        self.lb = np.array([bounds.get(n, (0, np.inf))[0] if bounds else 0 for n in params], float)
        self.ub = np.array([bounds.get(n, (0, np.inf))[1] if bounds else np.inf for n in params], float)
        self.x = None

    def predict(self, X, x=None):
        x = self.x if x is None else x
        return np.maximum(self.fn(dict(zip(self.params, x)), X), 1e-3)


def lin(c, X, names):
    return sum(c[n] * X[n] for n in names)


def linear_model(name="linear-log", extra=()):
    names = D.FEATURES + list(extra)
    return Model(name, names, lambda c, X: lin(c, X, names),
                 "sum c_i f_i over the 11 auto features" + (" + " + ", ".join(extra) if extra else ""))


def max_model(p_free):
    params = ["const", "launches", "merge"] + BYTES + TILES + (["p"] if p_free else [])

    def fn(c, X):
        b, t = lin(c, X, BYTES), lin(c, X, TILES)
        o = pnorm([b, t], c["p"]) if p_free else np.maximum(b, t)
        return c["const"] + c["launches"] * X["launches"] + c["merge"] * X["merge"] + o
    return Model("max(B,T)" if not p_free else "pnorm(B,T)", params, fn,
                 "const + launches + merge + " + ("||(B, T)||_p" if p_free else "max(B, T)") +
                 "; B = kv, unique_kv, partial MB; T = wave_kt, max_unit_kt, kctas, ksegments, padded_gflop, masked_kt",
                 {"p": (1, 32)})


def latency_model():
    params = ["const", "launches", "merge"] + BYTES + TILES + ["p"]

    def fn(c, X):
        lat = c["launches"] * X["launches"] + c["merge"] * X["merge"]
        return c["const"] + pnorm([lat, lin(c, X, BYTES), lin(c, X, TILES)], c["p"])
    return Model("pnorm(L,B,T)", params, fn,
                 "const + ||(L, B, T)||_p, L = launches + merge (launch latency overlaps the work too)", {"p": (1, 32)})


def launch_model(p_free=True):
    """Per launch: max(latency, its waves' work) summed; bytes overlapping the tiles' time."""
    params = ["const", "merge", "partial_mb", "kv_mb", "unique_kv_mb", "lat", "wave", "kcta", "masked_kt",
              "ksegments"] + (["p"] if p_free else [])

    def fn(c, X):
        per = np.maximum(c["lat"], c["wave"] * X["W"] + c["kcta"] * X["C"]) * X["M"]
        t = per.sum(1) + c["masked_kt"] * X["masked_kt"] + c["ksegments"] * X["ksegments"]
        b = c["kv_mb"] * X["kv_mb"] + c["unique_kv_mb"] * X["unique_kv_mb"]
        o = pnorm([b, t], c["p"]) if p_free else b + t
        return c["const"] + c["merge"] * X["merge"] + c["partial_mb"] * X["partial_mb"] + o
    return Model("launch-max" + ("+pnorm" if p_free else ""), params, fn,
                 "const + merge + partial_mb + " + ("||(B, T)||_p" if p_free else "B + T") +
                 "; B = kv, unique_kv MB; T = sum over attention launches of max(lat, a*waves*maxlen_kt + b*kctas)"
                 " + masked_kt + ksegments (launch_info)", {"p": (1, 32)})


def critical_path_model():
    """The launches' waves x longest unit as a critical path whose time per token grows with the tile's rows,
    overlapping the bytes (p-norm); launches, merge and partials additive."""
    params = ["const", "launches", "merge", "partial_mb", "kv_mb", "unique_kv_mb", "tok", "tok_rows", "masked_kt",
              "kctas", "ksegments", "p"]

    def fn(c, X):
        crit = ((c["tok"] + c["tok_rows"] * X["R"]) * X["W"] * X["M"]).sum(1)
        t = crit + c["masked_kt"] * X["masked_kt"] + c["kctas"] * X["kctas"] + c["ksegments"] * X["ksegments"]
        b = c["kv_mb"] * X["kv_mb"] + c["unique_kv_mb"] * X["unique_kv_mb"]
        return (c["const"] + c["launches"] * X["launches"] + c["merge"] * X["merge"] + c["partial_mb"] * X["partial_mb"]
                + pnorm([b, t], c["p"]))
    return Model("critpath+pnorm", params, fn,
                 "const + launches + merge + partial_mb + ||(B, T)||_p; B = kv, unique_kv MB; T = sum over launches of "
                 "waves x maxlen_kt x (tok + tok_rows x m/128) + masked_kt + kctas + ksegments (launch_info)",
                 {"p": (1, 32)})


def three_way_model(p_free=True):
    """The longest unit as a critical path of its own (one CTA streams it: ~21-25 us per 1000 tokens unmasked,
    ~35-40 masked, the lowest measured time per longest-unit token), overlapping the bytes and the
    waves; launches, merge and partials additive."""
    params = ["const", "launches", "merge", "partial_mb", "kv_mb", "unique_kv_mb", "wave_kt", "kctas", "ksegments",
              "padded_gflop", "max_unit_kt", "masked_kt"] + (["p"] if p_free else [])

    def fn(c, X):
        b = c["kv_mb"] * X["kv_mb"] + c["unique_kv_mb"] * X["unique_kv_mb"]
        t = lin(c, X, ["wave_kt", "kctas", "ksegments", "padded_gflop"])
        k = c["max_unit_kt"] * X["max_unit_kt"] + c["masked_kt"] * X["masked_kt"]
        o = pnorm([b, t, k], c["p"]) if p_free else np.maximum(np.maximum(b, t), k)
        return c["const"] + c["launches"] * X["launches"] + c["merge"] * X["merge"] + c["partial_mb"] * X["partial_mb"] + o
    return Model("max(B,T,K)" + ("p" if p_free else ""), params, fn,
                 "const + launches + merge + partial_mb + " + ("||(B, T, K)||_p" if p_free else "max(B, T, K)") +
                 "; B = kv, unique_kv MB; T = wave_kt, kctas, ksegments, padded_gflop; K = max_unit_kt, masked_kt "
                 "(the longest unit's critical path)", {"p": (1, 32)})


def occupancy_model():
    """Bytes at a bandwidth that needs enough CTAs in flight: B x max(1, k0 / CTAs per SM)."""
    params = ["const", "launches", "merge"] + BYTES + TILES + ["k0", "p"]

    def fn(c, X):
        per_sm = np.maximum(X["kctas"] * 1000 / 132, 1e-3)
        b = lin(c, X, BYTES) * np.maximum(1, c["k0"] / per_sm)
        return c["const"] + c["launches"] * X["launches"] + c["merge"] * X["merge"] + pnorm([b, lin(c, X, TILES)], c["p"])
    return Model("occupancy+pnorm", params, fn,
                 "as pnorm(B,T) with B x max(1, k0 / (CTAs per SM))", {"p": (1, 32), "k0": (0, 64)})


# ---------------------------------------------------------------- fitting --------------------------------------------

def residual_setup(plans, idx):
    """Per-plan rows (weight 0.3) and within-config pairs (weight 1), in log space."""
    by = collections.defaultdict(list)
    for i in idx:
        by[(plans[i]["set"], plans[i]["config"])].append(i)
    pairs = [(a, b) for v in by.values() for a, b in itertools.combinations(v, 2)]
    return np.array(idx), np.array(pairs).reshape(-1, 2)


def fit_lm(model, X, t, idx, pairs, x0s, iters=300):
    logt = np.log(t)

    def res(x):
        lp = np.log(model.predict(X, x))
        d = lp - logt
        return np.concatenate([FAC.ABS_WEIGHT * d[idx], FAC.PAIR_WEIGHT * (d[pairs[:, 0]] - d[pairs[:, 1]])])
    best = None
    for x0 in x0s:
        x = np.clip(np.array(x0, float), model.lb, model.ub)
        r = res(x)
        cost, mu = r @ r, 1e-3
        for _ in range(iters):
            J = np.empty((r.size, x.size))
            for j in range(x.size):
                h = 1e-6 * max(1e-3, abs(x[j]))
                xh = x.copy()
                xh[j] += h
                J[:, j] = (res(xh) - r) / h
            g, H = J.T @ r, J.T @ J
            improved = False
            for _ in range(12):
                A = H + mu * np.diag(np.diag(H) + 1e-12)
                try:
                    step = np.linalg.solve(A, -g)
                except np.linalg.LinAlgError:
                    mu *= 10
                    continue
                xn = np.clip(x + step, model.lb, model.ub)
                rn = res(xn)
                if rn @ rn < cost:
                    improved = cost - rn @ rn > 1e-10 * cost
                    x, r, cost, mu = xn, rn, rn @ rn, max(mu / 3, 1e-9)
                    break
                mu *= 4
            if not improved:
                break
        if best is None or cost < best[1]:
            best = (x, cost)
    model.x = best[0]
    return best[1]


def starts(model, lin_coef, rng, n=6):
    """Initial points: the linear fit's coefficients where names agree, plus jitter."""
    base = []
    for name in model.params:
        if name in lin_coef:
            base.append(max(lin_coef[name], 0.05))
        elif name == "p":
            base.append(2.0)
        elif name == "k0":
            base.append(1.0)
        elif name == "merge":
            base.append(2.0)
        elif name in ("tok", "tok_rows"):
            base.append(3.0)
        elif name == "lat":
            base.append(3.0)
        elif name == "wave":
            base.append(max(lin_coef.get("wave_kt", 1), 0.5))
        elif name == "kcta":
            base.append(max(lin_coef.get("kctas", 1), 0.5))
        else:
            base.append(0.5)
    base = np.array(base)
    out = [base]
    for _ in range(n - 1):
        out.append(base * np.exp(rng.normal(0, 0.7, base.size)))
    return out


def nnls_fit(plans, suites):
    """scripts/fit_auto_cost.py's fit (NNLS, per-query and node) on the training plans of `suites`."""
    configs = collections.defaultdict(dict)
    for p in plans:
        if p["set"] == "train" and p["suite"] in suites:
            for pl in p["planners"]:
                configs[(p["suite"], p["config"])][pl] = {"us": p["t"], "_features": np.array([p["f"][n] for n in D.FEATURES])}
    cf = [(s, k, v) for (s, k), v in configs.items() if "node" in v and "per-query" in v]
    coef = FAC.fit(cf, ["per-query", "node"])
    return dict(zip(D.FEATURES, coef)), len(cf)


class Fixed:
    def __init__(self, name, coef, desc):
        self.name, self.desc, self.params = name, desc, D.FEATURES
        self.x = np.array([coef[n] for n in D.FEATURES])

    def predict(self, X, x=None):
        return np.maximum(X["F"] @ self.x, 1e-3)


# ---------------------------------------------------------------- scoring --------------------------------------------

def score(plans, pred, sel, scale_fit=False):
    idx = [i for i in range(len(plans)) if sel(plans[i])]
    t = np.array([plans[i]["t"] for i in idx])
    pr = pred[idx]
    s = float(np.exp(np.median(np.log(t / pr)))) if scale_fit else 1.0
    err = np.abs(s * pr / t - 1)
    by = collections.defaultdict(list)
    for i in idx:
        if plans[i]["decider"]:
            by[(plans[i]["set"], plans[i]["suite"], plans[i]["config"])].append(i)
    hits, misses = 0, {}
    groups = collections.defaultdict(lambda: [0, 0])
    for key, v in by.items():
        tt = {i: plans[i]["t"] for i in v}
        pick = min(v, key=lambda i: pred[i])
        best = min(tt.values())
        ok = tt[pick] <= 1.03 * best
        hits += ok
        h, fam = plans[v[0]]["heads"], plans[v[0]]["family"]
        for gk in (("heads", h), ("family", fam), ("suite", key[1])):
            groups[gk][0] += ok
            groups[gk][1] += 1
        if not ok:
            misses[key] = (plans[pick]["planners"], tt[pick], best)
    return {"n_plans": len(idx), "med": float(np.median(err)), "p90": float(np.percentile(err, 90)), "scale": s,
            "hits": hits, "n": len(by), "misses": misses, "groups": dict(groups)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", default="us", choices=["us", "us_graph"])
    ap.add_argument("--train-planners", default="deciders", choices=["deciders", "all"],
                    help="fit the forms on the plans of auto/node/per-query (default) or of all eight planners")
    ap.add_argument("--fit-on", default="train", choices=["train", "h100", "train+h100"],
                    help="what the forms are fitted on (h100: a capacity check, in sample on the held-out set)")
    ap.add_argument("--suites", default="fasttree,pat,deft,flashforge,forests",
                    help="training suites the forms (and nnls-5suites) are fitted on")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/analysis/auto_cost_forms_results.txt"))
    args = ap.parse_args()
    recs, drops, extra = D.load_records()
    plans = build_plans(recs, args.time)
    X = matrix(plans)
    t = np.array([p["t"] for p in plans])
    lines = []
    out = lines.append
    c = collections.Counter((r["set"], r["planner"]) for r in recs)
    out(f"# auto cost-model forms, offline ({args.time}; forms fitted on {args.train_planners} plans of {args.fit_on}: {args.suites})")
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    out(f"# date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%MZ}; plans (features) of commit {head or 'unknown'};"
        f" command: python3 bench/analysis/auto_cost_forms.py {' '.join(sys.argv[1:])}")
    out("records matched to HEAD's plans: " + ", ".join(f"{k[0]}/{k[1]} {v}" for k, v in sorted(c.items())) +
        f"; dropped: {sum(drops.values())} {dict(drops)}")
    out("auto records matched through another plan: " + ", ".join(
        f"{k} {v}" for k, v in collections.Counter((r['set'], r['suite'], r['matched_as']) for r in recs
                                                   if r['planner'] == 'auto' and r['matched_as'] != 'auto').items()))
    sets = collections.Counter((p["set"], p["decider"]) for p in plans)
    out("distinct plans (set, decision candidate): " + ", ".join(f"{k} {v}" for k, v in sorted(sets.items())))

    fit_sets = set(args.fit_on.split("+"))
    suites = set(args.suites.split(","))
    train_idx = [i for i, p in enumerate(plans) if p["set"] in fit_sets and (args.train_planners == "all" or p["decider"])
                 and (p["set"] != "train" or p["suite"] in suites)]
    idx, pairs = residual_setup(plans, train_idx)
    out(f"training rows: {len(idx)} plans, {len(pairs)} within-config pairs")

    rng = np.random.default_rng(0)
    models = [Fixed("shipped", SHIPPED, "data/auto_cost_h100.json (fit on 6b2bea1 plans of fasttree, pat, deft)")]
    c3, n3 = nnls_fit(plans, {"fasttree", "pat", "deft"})
    models.append(Fixed("nnls-3suites", c3, f"fit_auto_cost.py's NNLS, fasttree+pat+deft ({n3} configs)"))
    c5, n5 = nnls_fit(plans, suites)
    models.append(Fixed("nnls-5suites", c5, f"fit_auto_cost.py's NNLS, suites {args.suites} ({n5} configs)"))
    forms = [linear_model(), linear_model("linear-log+merge", ["merge"]), max_model(False), max_model(True),
             latency_model(), launch_model(False), launch_model(True), critical_path_model(), occupancy_model(),
             three_way_model(False), three_way_model(True)]
    for m in forms:
        cost = fit_lm(m, X, t, idx, pairs, starts(m, c5, rng) + starts(m, SHIPPED, rng, 2))
        m.cost = cost
        models.append(m)

    sels = {"train": lambda p: p["set"] == "train", "h100": lambda p: p["set"] == "h100",
            "h200": lambda p: p["set"] == "h200"}
    results = {}
    for m in models:
        pred = m.predict(X)
        results[m.name] = {k: score(plans, pred, s, scale_fit=(k == "h200")) for k, s in sels.items()}
        results[m.name]["h100s"] = score(plans, pred, sels["h100"], scale_fit=True)
        results[m.name]["pred"] = pred

    out("")
    out("## parameters")
    for m in models:
        cost = f" (fit loss {m.cost:.2f})" if hasattr(m, "cost") else ""
        out(f"{m.name}: {m.desc}{cost}")
        out("   " + ", ".join(f"{n} {v:.4g}" for n, v in zip(m.params, m.x)))
    out("")
    out("## errors and decisions (|rel err| median / p90 over distinct plans; decisions = configs within 1.03x)")
    out(f"{'model':<22}{'train err':>14}{'train dec':>11}{'H100 err':>14}{'H100 dec':>10}{'H200 err*':>14}{'H200 dec':>10}"
        f"{'H100 err*':>14}")
    for m in models:
        r = results[m.name]
        row = f"{m.name:<22}"
        for k in ("train", "h100", "h200"):
            s = r[k]
            row += f"{100 * s['med']:6.1f}/{100 * s['p90']:5.1f}% {s['hits']:>4}/{s['n']:<4}"
        s = r["h100s"]
        row += f"{100 * s['med']:6.1f}/{100 * s['p90']:5.1f}% x{s['scale']:.2f}"
        out(row)
    out("(* H200: after one scale factor per model: " + ", ".join(
        f"{m.name} {results[m.name]['h200']['scale']:.3f}" for m in models) + ")")
    out("")
    out("## decisions by group (hits/configs): train suites; held-out by heads and family")
    keys_tr = sorted(k for k in results["shipped"]["train"]["groups"] if k[0] == "suite")
    keys_ho = sorted(k for k in results["shipped"]["h100"]["groups"] if k[0] in ("heads", "family"))
    out(f"{'model':<22}" + "".join(f"{k[1][:9]:>10}" for k in keys_tr))
    for m in models:
        g = results[m.name]["train"]["groups"]
        out(f"{m.name:<22}" + "".join(f"{g[k][0]:>5}/{g[k][1]:<4}" for k in keys_tr))
    for hs in ("h100", "h200"):
        out(f"{hs:<22}" + "".join(f"{k[1][:9]:>10}" for k in keys_ho))
        for m in models:
            g = results[m.name][hs]["groups"]
            out(f"  {m.name:<20}" + "".join(f"{g[k][0]:>5}/{g[k][1]:<4}" if k in g else f"{'-':>10}" for k in keys_ho))
    out("")
    out("## misses (configs not within 1.03x) per model; x = missed; vs shipped: fixed / new")
    names = [m.name for m in models]
    out(" " * 76 + " ".join(f"{i:>2}" for i in range(len(names))) + "   (" +
        ", ".join(f"{i} {n}" for i, n in enumerate(names)) + ")")
    for hs in ("train", "h100", "h200"):
        allm = sorted(set().union(*[results[n][hs]["misses"] for n in names]), key=lambda k: (k[2][1], k[2][0]))
        ship = set(results["shipped"][hs]["misses"])
        out(f"{hs}: " + ", ".join(f"{i} {len(results[n][hs]['misses'])} (-{len(ship - set(results[n][hs]['misses']))} "
                                  f"+{len(set(results[n][hs]['misses']) - ship)})" for i, n in enumerate(names)))
        for k in allm:
            tt = sorted(plans[i]["t"] for i in range(len(plans)) if plans[i]["set"] == k[0] and plans[i]["config"] == k[2]
                        and plans[i]["decider"])
            out(f"  {k[2][1]:>5} {k[2][0].replace('/work/main/data/workloads/', '')[:50]:<50} best {tt[0]:7.1f} 2nd "
                f"{tt[1] / tt[0] if len(tt) > 1 else 0:4.2f}x " +
                " ".join(f"{'x' if k in results[n][hs]['misses'] else '.':>2}" for n in names))
    out("## per model, against shipped: the misses it fixes (-) and the new ones (+)")

    def short(k):
        w = k[2][0].replace("/work/main/data/workloads/", "").replace(":record=5:step=3:prefix=", "@")
        for a, b in (("random:seed=", "rnd"), ("medusa:APPS_tree_size", "medusa"), (".json", ""), (":nodes=", "/"),
                     (":tokens=", "/"), ("tot:docmergeToT", "docmerge"), ("tot:sorting128ToT", "sorting"), (":task=", "/"),
                     (":iter=", "/"), ("fewshot:prompt=", "fewshot"), (":branches=", "/"), (":len=", "/"),
                     ("kary:arity=", "kary"), (":depth=", "/"), (":total=", "/"), (":leftmost=1", "L")):
            w = w.replace(a, b)
        return f"{w[:26]}@{k[2][1]}"
    for hs in ("train", "h100", "h200"):
        ship = set(results["shipped"][hs]["misses"])
        for n in names[1:]:
            ms = set(results[n][hs]["misses"])
            out(f"  {hs} {n}: -[{', '.join(short(k) for k in sorted(ship - ms))}] "
                f"+[{', '.join(short(k) for k in sorted(ms - ship))}]")
    # how hard the decisions are: configs whose second-best plan is within 1.03x (any pick of the two hits)
    for hs in ("train", "h100", "h200"):
        by = collections.defaultdict(list)
        for p in plans:
            if p["set"] == hs and p["decider"]:
                by[p["config"]].append(p["t"])
        easy = sum(len(v) == 1 or sorted(v)[1] <= 1.03 * min(v) for v in by.values())
        out(f"{hs}: {len(by)} configs, {easy} where every plan or the two fastest lie within 1.03x (no wrong pick "
            f"between those two); single distinct plan: {sum(len(v) == 1 for v in by.values())}")
    # the misses every model shares: measured and predicted per plan
    out("")
    out("## configs every fitted model misses on the H100: measured / predicted us per plan (shipped, linear-log, "
        "max(B,T,K))")
    shared = set.intersection(*[set(results[m.name]["h100"]["misses"]) for m in models if m.name != "nnls-5suites"])
    for k in sorted(shared, key=lambda k: (k[2][1], k[2][0])):
        out(f"  {k[2][1]} {k[2][0].replace('/work/main/data/workloads/', '')[:60]}")
        for i, p in enumerate(plans):
            if p["set"] == "h100" and p["config"] == k[2] and p["decider"]:
                f = p["f"]
                out(f"     {'+'.join(p['planners']):<16} {p['t']:6.1f} | " + " ".join(
                    f"{results[n]['pred'][i]:6.1f}" for n in ("shipped", "linear-log", "max(B,T,K)")) +
                    f" | launches {f['launches']:.0f} merge {f['merge']:.0f} kv {f['kv_mb']:.0f} MB partial "
                    f"{f['partial_mb']:.0f} MB kctas {f['kctas']:.3f} max_unit {f['max_unit_kt']:.2f} masked "
                    f"{f['masked_kt']:.2f} wave {f['wave_kt']:.2f}")
    # run-to-run noise: the H100 auto plans timed at both 9c59fb1 and 7011fd2
    pairs_t = collections.defaultdict(dict)
    for r in recs:
        if r["set"] == "h100" and r["planner"] == "auto" and r[args.time] > 0:
            pairs_t[(r["config"], r["sig"])]["7011" if "7011fd2" in r["source"] else "9c59"] = r[args.time]
    lr = np.array([abs(np.log(v["7011"] / v["9c59"])) for v in pairs_t.values() if len(v) == 2])
    out(f"run-to-run: {lr.size} H100 auto plans timed at 9c59fb1 and 7011fd2: |log ratio| median {np.median(lr):.3f}, "
        f"p90 {np.percentile(lr, 90):.3f}, max {lr.max():.3f}")
    # named examples
    out("")
    out("## the docs' example: random:seed=211:nodes=2048:tokens=200 at 16/1 (H100), predicted us per plan")
    for i, p in enumerate(plans):
        if p["set"] == "h100" and p["config"] == ("random:seed=211:nodes=2048:tokens=200", "16/1"):
            out(f"   {'+'.join(p['planners']):<22} measured {p['t']:6.1f}  " + "  ".join(
                f"{m.name} {results[m.name]['pred'][i]:6.1f}" for m in models))
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
