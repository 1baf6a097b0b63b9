#!/usr/bin/env python3
"""Two runs of the same suites compared config by config (an A/B of one option).

Each side is one or more results.json of `treeattn bench --suite ... --out DIR`,
or record lists of `treeattn bench --json` (several: repeated rounds, whose
per-config minimum is taken). Configs are matched on (workload, heads,
planner); with --ignore-planner on (workload, heads) only, for an A/B of two
plannings (scripts/planner_ab.sh). Prints the geometric mean of B / A on the
eager median (`us`) and on the CUDA-graph replay (`us_graph`), over all
configs and over those whose read-only bound is below --small-read us (issue
21 goal 3's latency-bound set), then the small configs (--all: every
config) one by one.

    python3 scripts/compare_suite_runs.py --a A1/results.json A2/results.json \
        --b B1/results.json B2/results.json [--small-read 10] [--all] [--json OUT]
"""
import argparse
import json
import math


def load(paths, ignore_planner=False):
    best = {}
    meta = None
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        records = doc["records"] if isinstance(doc, dict) else doc  # a suite's results.json, or bench --json
        meta = meta or {k: (doc if isinstance(doc, dict) else (records or [{}])[0]).get(k)
                        for k in ("device", "commit", "date", "command")}
        for r in records:
            key = (r.get("suite", ""), r["workload"], r["num_qo_heads"], r["num_kv_heads"],
                   "" if ignore_planner else r["planner"])
            old = best.get(key)
            if old is None:
                best[key] = dict(r)
            else:
                for t in ("us", "us_graph"):
                    if r.get(t, 0) > 0:
                        old[t] = min(old.get(t) or math.inf, r[t])
    return meta, best


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", nargs="+", required=True, help="results.json of side A (rounds)")
    ap.add_argument("--b", nargs="+", required=True, help="results.json of side B (rounds)")
    ap.add_argument("--small-read", type=float, default=10.0, help="small configs: read_us below this")
    ap.add_argument("--all", action="store_true", help="list every config, not only the small ones")
    ap.add_argument("--ignore-planner", action="store_true", help="match configs on workload and heads only")
    ap.add_argument("--json", help="write the per-config table and the means here")
    a = ap.parse_args()
    meta_a, ra = load(a.a, a.ignore_planner)
    meta_b, rb = load(a.b, a.ignore_planner)
    keys = sorted(set(ra) & set(rb))
    if not keys:
        raise SystemExit("no config in both sides")
    rows = []
    for k in keys:
        x, y = ra[k], rb[k]
        rows.append(dict(suite=k[0], workload=k[1], heads=f"{k[2]}/{k[3]}", planner=k[4] or x["planner"], read_us=x.get("read_us") or 0,
                         a_us=x["us"], b_us=y["us"], a_graph=x.get("us_graph", 0), b_graph=y.get("us_graph", 0)))
    means = {}
    for name, sel in (("all", rows), ("small", [r for r in rows if 0 < r["read_us"] < a.small_read])):
        eager = [r["b_us"] / r["a_us"] for r in sel if r["a_us"] > 0 and r["b_us"] > 0]
        graph = [r["b_graph"] / r["a_graph"] for r in sel if r["a_graph"] > 0 and r["b_graph"] > 0]
        means[name] = dict(configs=len(sel), eager=geomean(eager), graph=geomean(graph),
                           eager_range=[min(eager, default=0), max(eager, default=0)])
        print(f"{name:5s} configs {len(sel):3d}: B/A eager geomean {means[name]['eager']:.3f} "
              f"(range {means[name]['eager_range'][0]:.3f}-{means[name]['eager_range'][1]:.3f}), "
              f"graph geomean {means[name]['graph']:.3f}")
    print(f"\n{'config':56s} {'planner':>9s} {'heads':>6s} {'read':>6s} {'A us':>7s} {'B us':>7s} {'B/A':>6s} {'A graph':>8s} {'B graph':>8s}")
    for r in rows:
        if a.all or 0 < r["read_us"] < a.small_read:
            print(f"{r['workload'][-56:]:56s} {r['planner'][:9]:>9s} {r['heads']:>6s} {r['read_us']:6.1f} {r['a_us']:7.1f} {r['b_us']:7.1f} "
                  f"{r['b_us'] / r['a_us']:6.3f} {r['a_graph']:8.1f} {r['b_graph']:8.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(a=dict(meta_a, files=a.a), b=dict(meta_b, files=a.b), means=means, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
