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
