"""CPU smoke test of bench/engine/engine_bench.py (the issue-18 engine benchmark): its four
programs x {auto, per-query} shrunk to a tiny random model, 2 decode steps, no transformers
reference, so that its logic (programs, floor, speed-ups, table, JSON) is checked before a
GPU run."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench(name="engine_bench"):
    """bench/engine/<name>.py as a module (skips without the extension)."""
    pytest.importorskip("treeattn.engine")
    try:
        from treeattn import TreeAttention  # noqa: F401
    except ImportError:
        pytest.skip("treeattn extension not built")
    path = os.path.join(ROOT, "bench", "engine", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_specs_scale():
    bench = load_bench()
    args = bench.parse_args(["--scale", "0.01", "--count-scale", "0.125", "--device", "cpu"])
    assert bench.spec_of("shared", args) == "shared:prompt=40,branches=8,question=16,gen=256"
    full = bench.parse_args(["--device", "cpu"])
    assert bench.spec_of("two-level", full) == ("two-level:system=1000,docs=8,doc=2000,"
                                                "questions=8,question=16,gen=256")
    assert bench.spec_of("shared", full, branches=8, gen=64).endswith("branches=8,question=16,gen=64")


def test_cpu_smoke(tmp_path, capsys):
    bench = load_bench()
    out = tmp_path / "engine_bench.json"
    rc = bench.main(["--model", "random:tiny", "--device", "cpu", "--steps", "2",
                     "--scale", "0.01", "--count-scale", "0.125", "--hf-reference", "off",
                     "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    for key in ("device", "date", "commit", "command", "bandwidth_bytes_per_s", "speedups"):
        assert key in report
    rows = report["rows"]
    assert [(r["program"], r["attention"]) for r in rows] == [
        (p, a) for p in bench.PROGRAMS for a in ("auto", "per-query")]
    for r in rows:
        assert "error" not in r, r
        assert r["steps"] == 2
        assert r["tpot_ms_median"] > 0 and r["tpot_ms_p90"] >= r["tpot_ms_median"]
        assert 0 < r["attention_share"] < 1
        assert r["step_over_floor"] > 0
        # the forest grows by one token per sequence and step
        assert r["unique_kv_tokens_last"] - r["unique_kv_tokens_first"] == r["sequences"]
    assert set(report["speedups"]) == set(bench.PROGRAMS)
    printed = capsys.readouterr().out
    assert "| program | attention | tokens/s |" in printed
