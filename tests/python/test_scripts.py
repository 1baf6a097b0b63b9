"""scripts/issue21_goals.py on a made-up suite result whose criteria are known."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def record(workload, heads, planner, us, read_us):
    hq, hk = heads
    return dict(workload=workload, num_qo_heads=hq, num_kv_heads=hk, planner=planner, us=us, read_us=read_us,
                commit="abc1234")


def test_issue21_goals_counts_each_criterion(tmp_path):
    recs = []
    # a: auto best and within both criteria.
    recs += [record("a", (32, 8), p, us, 8.0) for p, us in [("auto", 10.0), ("node", 10.5), ("per-query", 20.0)]]
    # b: auto 1.04x node (criterion 1 fails; node is the best, so criterion 2 holds).
    recs += [record("b", (16, 1), p, us, 20.0) for p, us in [("auto", 41.6), ("node", 40.0), ("per-query", 50.0)]]
    # c: fasttree 10 % faster than auto (criterion 2 fails; criterion 1 holds).
    recs += [record("c", (32, 32), p, us, 30.0)
             for p, us in [("auto", 33.0), ("node", 33.0), ("per-query", 60.0), ("fasttree", 30.0)]]
    d = tmp_path / "fasttree"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(dict(suite="fasttree", records=recs)))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "issue21_goals.py"), str(d / "results.json"), "--show"],
                         capture_output=True, text=True, check=True).stdout
    assert "fasttree     3 configs (commit abc1234): criterion 1   2, criterion 2   2" in out, out
    assert "all 3 configs: criterion 1 2 (66.7 %), criterion 2 2 (66.7 %" in out, out
    # Goal 3: read_us / us of auto per head config; config a is the one under 10 us of bare read.
    assert "32/8   0.800 over  1 configs (target 0.70)" in out, out
    assert "16/1   0.481 over  1 configs (target 0.45)" in out, out
    assert "configs with read_us < 10 us: 1, within read_us + 6 us: 1" in out, out
    assert "c1: min(node, per-query) 40.0" in out and "c2: best fasttree 30.0 (1.100x)" in out, out


def test_issue21_goals_on_graph_replays(tmp_path):
    """--time us_graph judges by the records' graph replays; a record without one (bench skips it
    past 1 ms) counts with its eager time."""
    def rec(planner, us, us_graph):
        return dict(record("a", (32, 8), planner, us, 8.0), us_graph=us_graph)
    # Eager: auto 1.10x node (both criteria fail); replayed: auto the fastest. per-query has no replay.
    recs = [rec("auto", 11.0, 9.0), rec("node", 10.0, 9.5), rec("per-query", 20.0, 0.0)]
    d = tmp_path / "pat"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(dict(suite="pat", records=recs)))
    script = [sys.executable, str(ROOT / "scripts" / "issue21_goals.py"), str(d / "results.json"), "--show"]
    eager = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert "all 1 configs: criterion 1 0 (0.0 %), criterion 2 0 (0.0 %" in eager, eager
    graph = subprocess.run(script + ["--time", "us_graph"], capture_output=True, text=True, check=True).stdout
    assert "all 1 configs: criterion 1 1 (100.0 %), criterion 2 1 (100.0 %" in graph, graph
    assert "32/8   0.889 over  1 configs (target 0.70)" in graph, graph  # read_us 8 / 9


def _treeattn_cli():
    for p in ["build/cpu/treeattn", "build/default/treeattn"]:
        if (ROOT / p).exists():
            return ROOT / p
    return None


def test_calibrate_auto_fits_as_fit_auto_cost_py_does(tmp_path):
    """`treeattn calibrate --auto --from-samples` (C++) and scripts/fit_auto_cost.py
    (numpy) fit the same coefficients and margin from the same measurements."""
    import numpy as np
    import pytest
    cli = _treeattn_cli()
    if cli is None:
        pytest.skip("the treeattn CLI is not built (build/cpu or build/default)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import fit_auto_cost as fac
    rng = np.random.default_rng(21)
    truth = np.array([0.7, 7.6, 0.12, 0.17, 0.55, 7.1, 6.3, 0.2, 0.0, 2.5, 3.0])
    assert len(truth) == len(fac.FEATURES)
    samples, configs = [], []
    for i in range(150):
        f = {p: np.concatenate([[1.0], rng.uniform(0, 10, len(truth) - 1)]) for p in ("per-query", "node")}
        # Times of the model with 10 % noise, so the fit is a compromise, not an exact solve.
        t = {p: float(f[p] @ truth * rng.uniform(0.9, 1.1)) for p in f}
        samples.append(dict(config=f"c{i}", group="g", per_query_us=t["per-query"], node_us=t["node"],
                            per_query=dict(zip(fac.FEATURES, f["per-query"].tolist())),
                            node=dict(zip(fac.FEATURES, f["node"].tolist()))))
        configs.append(("g", (f"c{i}", 32, 8), {p: {"us": t[p], "_features": f[p]} for p in f}))
    path = tmp_path / "samples.json"
    path.write_text(json.dumps({"format": "treeattn-auto-cost-samples/1", "device": "test", "samples": samples}))
    table = tmp_path / "table.json"
    subprocess.run([str(cli), "calibrate", "--auto", "--from-samples", str(path), "--out", str(table)],
                   check=True, capture_output=True, text=True)
    got = json.loads(table.read_text())
    coef, margin = fac.fit_with_margin(configs, ["per-query", "node"])
    want = dict(zip(fac.FEATURES, coef))
    assert abs(got["margin"] - margin) < 1e-12, (got["margin"], margin)
    for name in fac.FEATURES:
        assert abs(got["coefficients"][name] - want[name]) <= 1e-6 * max(1.0, abs(want[name])), \
            (name, got["coefficients"][name], want[name])
    assert sum(c > 0 for c in coef) < len(coef), "the noise must leave some coefficient at the constraint"


def test_compare_suite_runs_takes_each_sides_best_round(tmp_path):
    def run(name, recs):
        d = tmp_path / name
        d.mkdir()
        rows = [dict(suite="s", workload=w, num_qo_heads=32, num_kv_heads=8, planner="auto", us=us, us_graph=g,
                     read_us=read) for w, us, g, read in recs]
        (d / "results.json").write_text(json.dumps(dict(device="x", commit="abc", records=rows)))
        return str(d / "results.json")

    a1 = run("a1", [("small", 10.0, 9.0, 4.0), ("big", 100.0, 100.0, 80.0)])
    a2 = run("a2", [("small", 12.0, 8.0, 4.0), ("big", 90.0, 95.0, 80.0)])  # best of A: small 10 / 8, big 90 / 95
    b1 = run("b1", [("small", 9.0, 8.0, 4.0), ("big", 99.0, 95.0, 80.0)])
    out_json = tmp_path / "ab.json"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_suite_runs.py"), "--a", a1, a2, "--b", b1,
                          "--json", str(out_json)], capture_output=True, text=True, check=True).stdout
    means = json.loads(out_json.read_text())["means"]
    assert means["small"]["configs"] == 1 and abs(means["small"]["eager"] - 0.9) < 1e-9, out
    assert abs(means["small"]["graph"] - 1.0) < 1e-9, out
    assert abs(means["all"]["eager"] - (0.9 * 1.1) ** 0.5) < 1e-9, out
    assert "small configs   1" in out and "big" not in out.split("\n\n", 1)[1], out


def test_compare_suite_runs_matches_bench_json_lists_across_planners(tmp_path):
    # scripts/planner_ab.sh: `treeattn bench --json` record lists, two plannings of one planner name.
    def run(name, recs, planner="auto"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps([dict(workload=w, num_qo_heads=q, num_kv_heads=8, planner=planner, us=us, us_graph=us,
                                         read_us=None, commit="abc") for w, q, us in recs]))
        return str(path)

    a1 = run("a1", [("medusa", 32, 44.0), ("fewshot", 64, 33.3)])
    a2 = run("a2", [("medusa", 32, 45.0), ("fewshot", 64, 33.0)])
    b1 = run("b1", [("medusa", 32, 33.5), ("fewshot", 64, 35.4)], planner="node")
    script = [sys.executable, str(ROOT / "scripts" / "compare_suite_runs.py"), "--a", a1, a2, "--b", b1, "--all"]
    assert subprocess.run(script, capture_output=True, text=True).returncode != 0  # planners differ: nothing matches
    out_json = tmp_path / "ab.json"
    out = subprocess.run(script + ["--ignore-planner", "--json", str(out_json)], capture_output=True, text=True,
                         check=True).stdout
    means = json.loads(out_json.read_text())["means"]
    assert means["all"]["configs"] == 2, out
    assert abs(means["all"]["eager"] - (33.5 / 44.0 * 35.4 / 33.0) ** 0.5) < 1e-9, out
    assert "medusa" in out and "fewshot" in out and "0.761" in out, out


def test_compare_kv_dtypes_estimates_the_dram_only_speedup(tmp_path):
    def run(name, recs):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(dict(device="x", commit="abc", command=name, records=[
            dict(workload=w, num_qo_heads=32, num_kv_heads=8, planner="auto", us=us, floor_us=floor, max_rel_err=1e-4)
            for w, us, floor in recs])))
        return str(path)

    # At its floor the 16-bit run halves with the bytes (2x); 20 us above a 40 us floor stay (60 / 40 = 1.5x).
    base = run("fp16", [("floor", 40.0, 40.0), ("above", 60.0, 40.0), ("small", 10.0, 2.0)])
    fp8 = run("fp8", [("floor", 25.0, 20.0), ("above", 45.0, 20.0), ("small", 9.0, 1.0)])
    out_json = tmp_path / "cmp.json"
    script = [sys.executable, str(ROOT / "bench" / "kv" / "compare_kv_dtypes.py")]
    out = subprocess.run(script + [base, fp8, "--json", str(out_json)], capture_output=True, text=True, check=True).stdout
    means = json.loads(out_json.read_text())["means"]
    assert means["memory_bound_configs"] == 2, out
    assert abs(means["memory_bound_dram_only_geomean"] - (2.0 * 1.5) ** 0.5) < 1e-9, out
    assert means["memory_bound_dram_only_at_target"] == 1, out
    assert abs(means["memory_bound_geomean"] - (40 / 25 * 60 / 45) ** 0.5) < 1e-9, out
    again = subprocess.run(script + ["--compare", str(out_json)], capture_output=True, text=True, check=True).stdout
    assert again.splitlines()[-2:] == out.splitlines()[-2:], again


def test_fit_auto_cost_reads_ab_pairs(tmp_path):
    """fit_auto_cost.py --pairs: a planner_ab table's configs (long specs cut at
    the front, as the table prints them) are planned with each variant's options,
    and auto's rule on a model's prices is scored against the measured times."""
    import numpy as np
    import pytest
    cli = _treeattn_cli()
    if cli is None:
        pytest.skip("the treeattn CLI is not built (build/cpu or build/default)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import fit_auto_cost as fac
    spec = "fasttree:N=1,4,16,64:C=1024,256,128,32"
    configs = tmp_path / "configs.txt"
    configs.write_text(f"# a comment\n32/8 {spec}\n")
    table = tmp_path / "ab.txt"
    table.write_text("all   configs   1: B/A eager geomean 1.2\n\n"
                     "config    planner  heads   read    A us    B us    B/A  A graph  B graph\n"
                     f"{spec[8:]}   auto   32/8   5.0   10.0   12.0  1.200   10.1   12.1\n")
    manifest = tmp_path / "pairs.json"
    manifest.write_text(json.dumps([{"table": str(table), "configs": str(configs), "a": [],
                                     "b": ["--plan-opt", "tile_rows=16"]}]))
    # The plans as timed are recorded first (--record-plans), then checked:
    # a pair whose plan the CLI no longer makes is left out.
    recorded, _ = fac.load_pairs(str(manifest), str(cli), record=True)
    assert len(recorded) == 1
    pairs, stale = fac.load_pairs(str(manifest), str(cli))
    assert len(pairs) == 1 and stale == 0
    entries = json.loads(manifest.read_text())
    entries[0]["plans"][f"32/8 {spec}"][1][0] += 1  # B timed with one unit more than the CLI now plans
    manifest.write_text(json.dumps(entries))
    assert fac.load_pairs(str(manifest), str(cli)) == ([], 1)
    label, fa, fb, ta, tb = pairs[0]
    assert label == f"32/8 {spec}" and (ta, tb) == (10.0, 12.0)
    kctas = fac.FEATURES.index("kctas")
    assert fb[kctas] > fa[kctas], "16-row tiles make more units"
    cheap_units = np.zeros(len(fac.FEATURES))
    cheap_units[fac.FEATURES.index("kv_mb")] = 1.0  # B re-reads more KV: priced slower, A kept (the faster)
    assert fac.pair_score(pairs, cheap_units) == 1
    favour_b = np.zeros(len(fac.FEATURES))
    favour_b[fac.FEATURES.index("launches")] = 1.0  # B's one launch priced faster: B taken, 1.2x slower
    assert fb @ favour_b < 0.95 * (fa @ favour_b)
    assert fac.pair_score(pairs, favour_b) == 0


def test_ab_table_takes_each_binarys_fastest_round_and_ratios_to_the_first(tmp_path):
    """scripts/ab_table.py on a made-up medusa_ab.sh log: two rounds, three binaries, a config one
    binary lacks, a workload path under TREEATTN_DATA_DIR shortened."""
    data = tmp_path / "data"
    lines = []
    for rnd, times in ((1, {"v0": (10.0, 40.0), "v1": (9.0, 44.0), "v2": (12.0, None)}),
                       (2, {"v0": (11.0, 38.0), "v1": (8.0, 45.0), "v2": (11.0, None)})):
        for b, (a, m) in times.items():
            lines.append(f"### round {rnd} bin {b} heads 32/8")
            lines.append("fasttree:N=1,10:C=4000,400  (10 queries, ...)")
            lines.append(f"    auto        12   2 {a:10.1f}        0.0   1.00 MB")
            if m is not None:
                lines.append(f"medusa:{data}/workloads/APPS_tree_size32.json:record=0  (33 queries, ...)")
                lines.append(f"    auto        30   3 {m:10.1f}        0.0   9.00 MB")
    log = tmp_path / "ab.txt"
    log.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_table.py"), str(log), "v0", "v1", "v2"],
                         capture_output=True, text=True, check=True, env={"TREEATTN_DATA_DIR": str(data)}).stdout
    rows = {l.split()[0]: l.split() for l in out.splitlines() if l.startswith(("fasttree", "medusa"))}
    assert rows["fasttree:N=1,10:C=4000,400"][2:] == ["10.0", "8.0", "11.0", "0.800", "1.100"], out
    assert rows["medusa:APPS_tree_size32.json:record=0"][2:] == ["38.0", "44.0", "nan", "1.158", "nan"], out
    assert "geomean v1/v0 over 2: 0.962" in out and "geomean v2/v0 over 1: 1.100" in out, out


def test_sass_loop_finds_the_kv_loop_and_counts_its_spills():
    """scripts/sass_loop.py on a made-up nvdisasm listing: the K/V loop is the shortest backward
    branch spanning every HGMMA; its local-memory loads and stores are counted (an LDL before
    the loop and one after it are not)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import sass_loop

    listing = """
        /*0000*/                   LDL R4, [R1+0x4] ;
.L_x_1:
	//## File "attention_kernel.cuh", line 10
        /*0010*/                   LDS R2, [R0] ;
        /*0020*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ ;
        /*0030*/                   LDL R8, [R1+0x8] ;
.L_x_2:
        /*0040*/                   HGMMA.64x128x16.F32 R40, R8, gdesc[UR8], R40 ;
        /*0050*/                   STL [R1], R9 ;
        /*0060*/              @P0 BRA `(.L_x_2) ;
        /*0070*/              @P1 BRA `(.L_x_1) ;
        /*0080*/                   LDL R5, [R1+0xc] ;
"""
    insts, labels = sass_loop.parse(listing.splitlines())
    loop = sass_loop.find_loop(insts, labels)
    assert loop == (0x10, 0x70)
    body = [i for i in insts if loop[0] <= i[0] <= loop[1]]
    assert sass_loop.loop_counts(body) == (7, 2, 2)
    assert body[0][2] == ("attention_kernel.cuh", 10)
