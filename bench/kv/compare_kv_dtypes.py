#!/usr/bin/env python3
"""fp8 vs 16-bit K/V pools on the same suite configs (issue 21, goal 5).

Reads two `treeattn bench --suite ... --out DIR` results (one run with the
dtype's pools, one with --kv-dtype fp8_e4m3, same planner) and prints, per
config and head shape, the 16-bit time, the fp8 time and their ratio, then
the geometric mean of the ratio over the memory-bound configs (16-bit
floor_us >= --min-floor, default 30 us, the goal's criterion) and over all.

It also prints the speed-up fp8 would reach if it removed only DRAM time
(`dram_only`): the 16-bit time less its DRAM floor plus the fp8 floor, i.e.
with the 16-bit run's time above its floor (latency, L2 re-reads, compute,
merge) kept as it is. An estimate, not a bound: fp8 also halves the bytes
re-read from L2, and adds its conversion.

    python3 bench/kv/compare_kv_dtypes.py A/results.json B/results.json [--json OUT]
    python3 bench/kv/compare_kv_dtypes.py --compare OUT.json   (the table of an earlier --json)
"""
import argparse
import json
import math
import sys


def records(path):
    with open(path) as f:
        doc = json.load(f)
    recs = {}
    for r in doc["records"]:
        key = (r["workload"], r["num_qo_heads"], r["num_kv_heads"], r["planner"])
        recs[key] = r
    return doc, recs


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", nargs="?", help="results.json of the 16-bit pools")
    ap.add_argument("fp8", nargs="?", help="results.json of the fp8 pools")
    ap.add_argument("--compare", help="instead: the rows of an earlier --json output")
    ap.add_argument("--min-floor", type=float, default=30.0, help="memory-bound: 16-bit floor_us at least this")
    ap.add_argument("--json", help="write the table and the means here")
    a = ap.parse_args()
    if a.compare:
        with open(a.compare) as f:
            fp8_doc = base_doc = json.load(f)
        base_doc = dict(base_doc, command=(base_doc.get("commands") or [None, None])[0])
        fp8_doc = dict(fp8_doc, command=(fp8_doc.get("commands") or [None, None])[1])
        rows = fp8_doc["rows"]
    elif a.base and a.fp8:
        base_doc, base = records(a.base)
        fp8_doc, fp8 = records(a.fp8)
        rows = []
        for key, r in base.items():
            f = fp8.get(key)
            if f is None or not r.get("us") or not f.get("us"):
                continue
            rows.append(dict(workload=key[0], heads=f"{key[1]}/{key[2]}", planner=key[3], floor_us=r["floor_us"],
                             us_16bit=r["us"], us_fp8=f["us"], floor_us_fp8=f["floor_us"], speedup=r["us"] / f["us"],
                             err_fp8=f.get("max_rel_err")))
    else:
        ap.error("give the two results.json, or --compare")
    for x in rows:  # fp8 removing only DRAM time: the 16-bit time above its floor stays
        x["dram_only"] = x["us_16bit"] / (max(x["us_16bit"] - x["floor_us"], 0.0) + x["floor_us_fp8"])
    if not rows:
        sys.exit("no config is in both files")
    rows.sort(key=lambda x: -x["floor_us"])
    print(f"{'workload':52} {'heads':>6} {'floor':>7} {'16-bit us':>10} {'fp8 us':>8} {'x':>6} {'dram x':>7} {'fp8 err':>9}")
    for x in rows:
        err = "-" if x["err_fp8"] is None else f"{x['err_fp8']:.1e}"
        print(f"{x['workload'][:52]:52} {x['heads']:>6} {x['floor_us']:7.1f} {x['us_16bit']:10.1f} {x['us_fp8']:8.1f} "
              f"{x['speedup']:6.2f} {x['dram_only']:7.2f} {err:>9}")
    memory_bound = [x for x in rows if x["floor_us"] >= a.min_floor]
    bound = [x["speedup"] for x in memory_bound]
    dram_only = [x["dram_only"] for x in memory_bound]
    means = dict(memory_bound_configs=len(bound), memory_bound_geomean=geomean(bound),
                 memory_bound_min=min(bound) if bound else float("nan"), all_configs=len(rows),
                 all_geomean=geomean([x["speedup"] for x in rows]), memory_bound_dram_only_geomean=geomean(dram_only),
                 memory_bound_dram_only_at_target=sum(d >= 1.7 for d in dram_only))
    print(f"\nfloor >= {a.min_floor:g} us: {means['memory_bound_configs']} configs, fp8 speedup geomean "
          f"{means['memory_bound_geomean']:.2f}x, min {means['memory_bound_min']:.2f}x; all {len(rows)} configs: "
          f"{means['all_geomean']:.2f}x")
    print(f"removing only DRAM time (the 16-bit time above its floor kept): geomean {means['memory_bound_dram_only_geomean']:.2f}x "
          f"over the {len(bound)}, {means['memory_bound_dram_only_at_target']} at >= 1.7x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=fp8_doc.get("device"), commit=fp8_doc.get("commit"), date=fp8_doc.get("date"),
                           commands=[base_doc.get("command"), fp8_doc.get("command")], min_floor_us=a.min_floor,
                           means=means, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
