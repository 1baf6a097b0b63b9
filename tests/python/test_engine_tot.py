"""Tree-of-thoughts on the engine (python/treeattn/engine/tot.py, recorded.py): scaled-down
replays of the recorded ToT files and the live policy on a tiny random Llama, every branch's
logits at every step against transformers' forward over the branch's full sequence, the
batch of every step against the schedule, the cache's invariants after every step and its
free count at the end (after evicting the unreferenced cached pages), and bad input."""
import copy
import json
import os
import re

import pytest
import torch

from hf_models import hf_logits, save, tiny_hf_model
from treeattn.engine import build_engine, load_model
from treeattn.engine.__main__ import main as engine_main
from treeattn.engine.recorded import load_tot_file, scaled
from treeattn.engine.tot import make_tot_program, run_tot

WORKLOADS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                         "workloads")   # the recorded ToT files (DeFT's dataset)
FILES = ["docmergeToT.json", "sorting128ToT.json"]
ATOL = 1e-4        # fp32 engine vs fp32 transformers (as test_engine_hf.py)
FP16_ATOL = 5e-2   # fp16 engine vs fp32 transformers (as test_engine_hf.py)
# on CUDA: fp32 engine vs transformers fp32 on the CPU (other kernels, other summation
# order; the logits are O(1)); fp16 engine over longer branches (~200 tokens) vs fp32: the
# relative error per branch, ~4e-3 with treeattn's CPU executor on the same replay
GPU_FP32_ATOL = 1e-3
GPU_FP16_RTOL = 1e-2


def workload(name):
    path = os.path.join(WORKLOADS, name)
    if not os.path.isfile(path):
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    hf = tiny_hf_model("llama3")
    folder = save(hf, tmp_path_factory.mktemp("llama3"))
    return hf, folder


def run_checked(model, spec, attention="torch-ref", page_size=4, graphs=False, **kw):
    """Run spec on a pool sized by the program; cache.check() after every step; the free
    count back at its start value once unreferenced cached pages are evicted."""
    program = make_tot_program(spec, model.cfg.vocab_size, seed=3)
    engine = build_engine(model, attention, "auto", page_size=page_size,
                          num_pages=program.pages_needed(page_size),
                          max_batch=program.max_batch, graphs=graphs)
    free = engine.cache.num_free_pages()
    result = run_tot(engine, program, seed=5, record_logits=True, check_cache=True, **kw)
    engine.cache.check()
    engine.cache.evict(engine.capacity)
    assert engine.cache.num_free_pages() == free
    return program, result


def check_logits(hf, result, atol=None, rtol=None):
    """Each branch's rows: the prompt's last (root) or one per decode step, the first at
    rows_from; they equal transformers' logits over the branch's full sequence, to
    atol in every entry or to rtol in the branch's norm (‖engine - hf‖ / ‖hf‖)."""
    checked = 0
    for b in result.branches:
        if not b.logits:
            continue
        ref = hf_logits(hf, b.tokens)[b.rows_from:]
        got = torch.stack(b.logits)
        assert got.shape == ref.shape, (b.task, b.node)
        where = f"task {b.task} node {b.node} ({len(b.tokens)} tokens)"
        if atol is not None:
            err = (got - ref).abs().max().item()
            assert err <= atol, f"{where}: max |engine - transformers| = {err}"
        if rtol is not None:
            err = ((got - ref).norm() / ref.norm()).item()
            assert err <= rtol, f"{where}: relative error {err}"
        checked += len(b.logits)
    return checked


def check_replay_shape(program, result):
    """The run followed the schedule: each step's batch is the number of nodes generating
    in that iteration; each node has its recorded (scaled) length after its parent's."""
    tasks = program.policy.tasks
    per_iteration = {}
    for task in tasks:
        for t, n in task.generating_counts().items():
            per_iteration[t] = per_iteration.get(t, 0) + n
    assert result.batch_sizes == [per_iteration[t] for t in sorted(per_iteration)]
    assert len(result.branches) == sum(len(t.nodes) for t in tasks)
    for b in result.branches:
        node = tasks[b.task].nodes[b.node]
        assert b.generated == node.value
        if b.parent is not None:
            assert b.first_position == len(b.parent.tokens)
            assert len(b.tokens) == b.first_position + node.value


@pytest.mark.parametrize("name", FILES)
def test_replay_logits(models, name):
    hf, folder = models
    model = load_model(folder, dtype="fp32")
    spec = f"tot:file={workload(name)},tasks=3,scale=0.01"
    program, result = run_checked(model, spec)
    check_replay_shape(program, result)
    assert check_logits(hf, result, ATOL) > 100
    # siblings sample their own tokens (temperature 1): the branches differ
    firsts = [b.tokens[b.first_position] for b in result.branches if b.parent and
              b.parent.parent is None and b.value]
    assert len(set(firsts)) > 1


def test_overlap_keeps_the_tokens(models):
    """A step launched ahead (fed the sampled ids on the device) decodes what a step after
    the host read the tokens decodes: every branch's tokens are the same with overlap on and
    off, on the replay and on the live policy (which also reads log-probabilities)."""
    _, folder = models
    model = load_model(folder, dtype="fp32")
    for spec in (f"tot:file={workload(FILES[0])},tasks=3,scale=0.01",
                 "tot-live:prompt=9,tasks=2,rounds=2,width=2,k=2,budget=6"):
        runs = []
        for overlap in (True, False):
            program = make_tot_program(spec, model.cfg.vocab_size, seed=3)
            engine = build_engine(model, "torch-ref", "auto", page_size=4,
                                  num_pages=program.pages_needed(4), max_batch=program.max_batch)
            launched = []
            decode = engine.decode
            engine.decode = lambda seqs, ids=None, **kw: (launched.append(ids is not None),
                                                          decode(seqs, ids=ids, **kw))[1]
            result = run_tot(engine, program, seed=5, check_cache=True, overlap=overlap)
            runs.append([(b.task, b.node, b.tokens) for b in result.branches])
            assert any(launched) == overlap and not all(launched)
        assert runs[0] == runs[1]


def test_timed_steps_are_not_launched_ahead(models):
    """With overlap and attention timed on one step in attention_every, a timed step is
    decoded in its own step: launched ahead, its decode (all of it on a synchronous device)
    fell in the step before, and its attention share could pass 1 (test_bench_smoke under
    load). Steps between the timed ones are still launched ahead."""
    _, folder = models
    model = load_model(folder, dtype="fp32")
    program = make_tot_program(f"tot:file={workload(FILES[0])},tasks=3,scale=0.01", model.cfg.vocab_size, seed=3)
    engine = build_engine(model, "torch-ref", "auto", page_size=4, num_pages=program.pages_needed(4),
                          max_batch=program.max_batch)
    calls = []
    decode = engine.decode
    engine.decode = lambda seqs, ids=None, time_attention=False, **kw: (
        calls.append((ids is not None, time_attention)), decode(seqs, ids=ids, time_attention=time_attention, **kw))[1]
    result = run_tot(engine, program, seed=5, time_attention=True, attention_every=3, overlap=True)
    assert (True, True) not in calls
    assert (True, False) in calls and (False, True) in calls
    assert len(result.attention_steps) == len(result.attention_seconds) > 0


def test_replay_treeattn_planner(models):
    # treeattn's planner and CPU executor (fp16) plan each step's forest of three trees
    hf, folder = models
    model = load_model(folder, dtype="fp16")
    spec = f"tot:file={workload('sorting128ToT.json')},tasks=3,scale=0.005"
    program, result = run_checked(model, spec, attention="auto")
    check_replay_shape(program, result)
    assert check_logits(hf, result, FP16_ATOL) > 50


def node(id_, value, start, end, children=()):
    return dict(id=id_, value=value, start=start, end=end, children=list(children))


# task 0: node 1 is empty (value 0) with children, one of them empty too; node 2's children
# start at different iterations, one after a gap; node 3 stays live after its last token.
# task 1: its only thought starts after an idle iteration (nothing generating anywhere)
EDGE_CASES = [
    dict(prompt="", incompleted=False, data={str(n["id"]): n for n in [
        node(0, 6, -5, 0, [1, 2]), node(1, 0, 1, 0, [3, 4]), node(2, 3, 1, 3, [5, 6]),
        node(3, 2, 1, 4), node(4, 0, 1, 0), node(5, 3, 4, 6), node(6, 2, 6, 7)]}),
    dict(prompt="", incompleted=True, data={str(n["id"]): n for n in [
        node(0, 5, -4, 0, [1]), node(1, 2, 9, 10)]}),
]


def test_edge_cases(models, tmp_path):
    path = tmp_path / "edges.json"
    path.write_text(json.dumps(EDGE_CASES))
    hf, folder = models
    model = load_model(folder, dtype="fp32")
    program, result = run_checked(model, f"tot:file={path}")
    check_replay_shape(program, result)
    assert result.batch_sizes == [2, 2, 1, 1, 1, 2, 1, 1, 1]
    check_logits(hf, result, ATOL)
    by_node = {(b.task, b.node): b for b in result.branches}
    empty = by_node[0, 1]
    assert empty.generated == 0 and empty.tokens == by_node[0, 0].tokens
    assert by_node[0, 3].first_position == by_node[0, 4].first_position == 6
    # max_steps stops early; everything held is released (run_checked checks the pool)
    _, short = run_checked(model, f"tot:file={path},max_steps=3")
    assert short.batch_sizes == [2, 2, 1]


def test_leaves_cached_or_freed(models):
    """leaves=cache publishes a finished leaf's pages (evictable, kept until the pool needs
    them), leaves=free frees them at once: the same pages held, a lower free list."""
    _, folder = models
    model = load_model(folder, dtype="fp32")
    spec = f"tot:file={workload('docmergeToT.json')},tasks=2,scale=0.01"
    _, freed = run_checked(model, spec)
    _, cached = run_checked(model, spec + ",leaves=cache")
    assert [b.tokens for b in freed.branches] == [b.tokens for b in cached.branches]
    if freed.held_pages_peak is not None:     # the C++ cache counts evictable pages
        assert freed.held_pages_peak == cached.held_pages_peak
    assert cached.free_pages_min < freed.free_pages_min


def test_live_policy(models):
    hf, folder = models
    model = load_model(folder, dtype="fp32")
    rounds, width, k, budget = 3, 2, 3, 4
    program, result = run_checked(
        model, f"tot-live:prompt=13,tasks=2,rounds={rounds},width={width},k={k},budget={budget}")
    check_logits(hf, result, ATOL)
    # rounds of budget steps: k branches per task, then min(width, k) * k
    assert result.batch_sizes == [2 * k] * budget + [2 * width * k] * budget * (rounds - 1)
    children = {}
    for b in result.branches:
        children.setdefault(id(b.parent), []).append(b)
    for b in result.branches:
        if b.parent is None:
            continue
        # the score is the mean log-probability of the path's tokens under the model
        lp = torch.log_softmax(b.parent.logits[-1], -1)[b.tokens[b.first_position]].item()
        for i, row in enumerate(b.logits[:-1]):
            lp += torch.log_softmax(row, -1)[b.tokens[b.first_position + 1 + i]].item()
        assert b.path_logprob == pytest.approx(b.parent.path_logprob + lp, abs=1e-3)
        assert b.path_tokens == b.parent.path_tokens + budget
    for siblings in children.values():
        if siblings[0].parent is None:
            continue                       # the roots
        forked = [b for b in siblings if id(b) in children]
        round_ = (siblings[0].start - 1) // budget + 1
        if round_ == rounds:
            assert not forked
            continue
        # this round's best `width` of the task (siblings of one parent are of one task,
        # and a task's round is the children of its previous round's survivors)
        same_round = [b for b in result.branches if b.task == siblings[0].task
                      and b.start == siblings[0].start]
        best = sorted(same_round, key=lambda b: -b.score)[:width]
        assert {id(b) for b in best} >= {id(b) for b in forked}
        assert all(len(children[id(b)]) == k for b in forked)
    assert sum(1 for b in result.branches if id(b) in children and b.parent) == 2 * width * (
        rounds - 1)


def test_pool_too_small_leaves_cache_consistent(models):
    _, folder = models
    model = load_model(folder, dtype="fp32")
    program = make_tot_program(f"tot:file={workload('sorting128ToT.json')},tasks=2,scale=0.01",
                               model.cfg.vocab_size)
    engine = build_engine(model, "torch-ref", "auto", page_size=4,
                          num_pages=program.pages_needed(4) // 3, max_batch=program.max_batch)
    free = engine.cache.num_free_pages()
    with pytest.raises(ValueError, match="KV cache full"):
        run_tot(engine, program, check_cache=True)
    engine.cache.check()
    engine.cache.evict(engine.capacity)
    assert engine.cache.num_free_pages() == free


@pytest.mark.parametrize("failing_call", [1, 2])
def test_failed_fork_releases_everything(models, monkeypatch, failing_call):
    """A step failing between two forks of one wave (children of the first parent forked,
    not yet decoding) still releases every sequence."""
    _, folder = models
    model = load_model(folder, dtype="fp32")
    program = make_tot_program(f"tot:file={workload('sorting128ToT.json')},tasks=2,scale=0.01",
                               model.cfg.vocab_size)
    engine = build_engine(model, "torch-ref", "auto", page_size=4,
                          num_pages=program.pages_needed(4), max_batch=program.max_batch)
    free = engine.cache.num_free_pages()
    calls, fork = [], engine.fork

    def failing_fork(seq, n):
        calls.append(n)
        if len(calls) == failing_call:
            raise ValueError("fork: injected failure")
        return fork(seq, n)
    monkeypatch.setattr(engine, "fork", failing_fork)
    with pytest.raises(ValueError, match="injected"):
        run_tot(engine, program, check_cache=True)
    engine.cache.check()
    engine.cache.evict(engine.capacity)
    assert engine.cache.num_free_pages() == free


def test_cli(capsys):
    spec = f"tot:file={workload('docmergeToT.json')},tasks=2,scale=0.005"
    engine_main(["--model", "random:tiny", "--device", "cpu", "--dtype", "fp32",
                 "--attention", "torch-ref", "--page-size", "4", "--program", spec, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["steps"] > 10 and report["end_to_end_s"] > 0
    assert report["widest_batch"] == report["max_batch"]   # the engine sized by the schedule


def test_bench_smoke(tmp_path, monkeypatch, capsys):
    """bench/engine/tot_bench.py on a tiny model, 2 tasks of each file shrunk: its rows,
    ratios, table and JSON (the numbers are the GPU run's business)."""
    pytest.importorskip("treeattn._treeattn")
    bench_dir = os.path.join(os.path.dirname(WORKLOADS), "..", "bench", "engine")
    monkeypatch.syspath_prepend(bench_dir)
    import tot_bench
    out = tmp_path / "tot.json"
    rc = tot_bench.main(["--model", "random:tiny", "--device", "cpu", "--tasks", "2",
                         "--scale", "0.01", "--max-steps", "12", "--attention-every", "4",
                         "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    for key in ("device", "date", "commit", "command", "ratios", "goal"):
        assert key in report
    rows = report["rows"]
    assert [(r["file"], r["attention"]) for r in rows] == [
        (f, a) for f in FILES for a in ("auto", "per-query")]
    for r in rows:
        assert r["steps"] == 12 and r["tasks"] == 2
        assert 0 < r["tpot_ms_median"] <= r["tpot_ms_p90"]
        assert r["end_to_end_s"] >= r["prefill_s"] + r["decode_s"] * 0.99
        assert 0 < r["attention_share"] < 1
    assert set(report["ratios"]) == set(FILES)
    assert "| file | attention | tasks |" in capsys.readouterr().out


def test_bench_combine(tmp_path, monkeypatch, capsys):
    """tot_bench --combine: one attention per run (as a replay longer than one device command
    is measured), merged into one report whose ratios are those of a run of both; parts that
    differ in options or repeat a case are refused by name."""
    pytest.importorskip("treeattn._treeattn")
    bench_dir = os.path.join(os.path.dirname(WORKLOADS), "..", "bench", "engine")
    monkeypatch.syspath_prepend(bench_dir)
    import tot_bench
    common = ["--model", "random:tiny", "--device", "cpu", "--tasks", "2", "--scale", "0.01",
              "--max-steps", "6", "--attention-every", "3", "--files", FILES[0]]
    parts = {}
    for attention in ("auto", "per-query"):
        parts[attention] = tmp_path / f"{attention}.json"
        assert tot_bench.main(common + ["--attentions", attention,
                                        "--out", str(parts[attention])]) == 0
    both = tmp_path / "both.json"
    assert tot_bench.main(["--combine", str(parts["auto"]), str(parts["per-query"]),
                           "--out", str(both)]) == 0
    report = json.loads(both.read_text())
    rows = {r["attention"]: r for r in report["rows"]}
    assert set(rows) == {"auto", "per-query"}
    ratio = report["ratios"][FILES[0]]["auto"]["end_to_end"]
    assert ratio == pytest.approx(rows["per-query"]["end_to_end_s"] / rows["auto"]["end_to_end_s"])
    assert report["goal"][FILES[0]]["met"] == (ratio >= tot_bench.GOAL)
    assert [p["source"] for p in report["parts"]] == [str(parts["auto"]), str(parts["per-query"])]
    assert all(p["command"] and p["date"] and p["commit"] for p in report["parts"])
    assert "| file | attention | tasks |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="repeats"):
        tot_bench.main(["--combine", str(parts["auto"]), str(parts["auto"])])
    other = json.loads(parts["per-query"].read_text())
    other["args"]["seed"] = 1
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="seed=1"):
        tot_bench.main(["--combine", str(parts["auto"]), str(tmp_path / "other.json")])


def test_specs():
    with pytest.raises(ValueError, match="tot needs file=PATH"):
        make_tot_program("tot:tasks=2", 256)
    with pytest.raises(ValueError, match="max_steps=-1 must be >= 0"):
        make_tot_program("tot:file=x.json,max_steps=-1", 256)
    with pytest.raises(ValueError, match="bad parameter 'width=2'"):
        make_tot_program("tot:file=x.json,width=2", 256)
    with pytest.raises(ValueError, match="leaves='keep'"):
        make_tot_program("tot-live:leaves=keep", 256)
    with pytest.raises(ValueError, match="tot-live k=0"):
        make_tot_program("tot-live:k=0", 256)
    with pytest.raises(ValueError, match="tot-live prompt and tasks must be >= 1"):
        make_tot_program("tot-live:tasks=0", 256)
    live = make_tot_program("tot-live:prompt=7,tasks=4,rounds=3,width=2,k=5,budget=3", 256)
    assert live.max_batch == 4 * 2 * 5 and [len(p) for p in live.prompts] == [7] * 4


def test_live_prompt_ids(models, tmp_path):
    """tot-live on prompts tokenized outside (as for a real checkpoint): one task each."""
    path = tmp_path / "ids.json"
    for bad, message in (([], "non-empty JSON list"), ([[1, 2], [300]], "task 1: expected"),
                         ([[1, True]], "task 0: expected")):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            make_tot_program(f"tot-live:prompt_ids={path}", 256)
    prompts = [[5, 6, 7, 8, 9], list(range(30, 51))]
    path.write_text(json.dumps(prompts))
    hf, folder = models
    model = load_model(folder, dtype="fp32")
    program, result = run_checked(model, f"tot-live:prompt_ids={path},rounds=2,width=1,k=2,"
                                         f"budget=3")
    assert program.prompts == prompts
    assert [b.tokens for b in result.branches if b.parent is None] == prompts
    assert result.batch_sizes == [4] * 6
    check_logits(hf, result, ATOL)


def test_scaled_keeps_order():
    tasks = load_tot_file(workload("sorting128ToT.json"), tasks=5)
    for task in tasks:
        small = scaled(task, 0.01)
        for n in small.nodes.values():
            assert n.end - n.start + 1 == n.value
            if n.parent >= 0:
                assert n.start == small.nodes[n.parent].end + 1
                assert (n.value == 0) == (task.nodes[n.id].value == 0)


# -- bad input: a ValueError naming the file, task, node and field ---------------------------

def _node(raw, key="3"):
    return raw[1]["data"][key]


def _cycle(raw):
    # nodes 2 and 3 (children of the root) become each other's child, nobody else's
    data = raw[1]["data"]
    data["0"]["children"] = [c for c in data["0"]["children"] if c not in (2, 3)]
    data["2"]["children"].append(3)
    data["3"]["children"].append(2)


BAD = {
    "missing field": (lambda r: _node(r).pop("value"), r"node '3': missing field 'value'"),
    "wrong type": (lambda r: _node(r).update(start="1"), r"node '3': field 'start' must be an integer"),
    "children type": (lambda r: _node(r).update(children=4), r"node '3': field 'children' must be a list"),
    "bool value": (lambda r: _node(r).update(value=True), r"node '3': field 'value' must be an integer"),
    "child not in data": (lambda r: _node(r, "0")["children"].append(999),
                          r"node '0': field 'children' names node 999, which is not in 'data'"),
    "two parents": (lambda r: _node(r, "3")["children"].append(2), r"node '3': field 'children' "
                    r"names node 2, already a child of node 0"),
    "cycle": (_cycle, r"node '[23]': field 'children' makes a cycle"),
    "negative value": (lambda r: _node(r).update(value=-4), r"node '3': field 'value' must be >= 0"),
    "start/end inconsistent": (lambda r: _node(r).update(end=_node(r)["start"] + _node(r)["value"] - 3),
                               r"node '3': fields 'start'/'end' .* inconsistent with 'value'"),
    "child before parent ends": (lambda r: _node(r).update(start=0),
                                 r"node '3': field 'start' \(0\) must come after its parent"),
    "root end": (lambda r: _node(r, "0").update(end=2, start=_node(r, "0")["start"] + 2),
                 r"node '0': field 'end' of the root must be 0"),
    "id not key": (lambda r: _node(r).update(id=4), r"node '3': field 'id' is 4"),
    "missing data": (lambda r: r[1].pop("data"), r"task 1: missing field 'data'"),
    "prompt type": (lambda r: r[1].update(prompt=5), r"task 1: field 'prompt' must be a str"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_file(tmp_path, case):
    edit, message = BAD[case]
    raw = copy.deepcopy(json.load(open(workload("sorting128ToT.json")))[:2])
    edit(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    # the whole file is checked before any engine step (a failure mid-run releases what it
    # holds: test_pool_too_small_leaves_cache_consistent)
    prefix = re.escape(f"{path}: ") + ("" if message.startswith("task") else "task 1, ")
    with pytest.raises(ValueError, match=prefix + message):
        make_tot_program(f"tot:file={path}", 256)


def test_bad_file_shape(tmp_path):
    path = tmp_path / "bad.json"
    for text, message in (("{\"data\": {}}", "expected a non-empty JSON list of tasks"),
                          ("[{\"data\": {}", "malformed JSON"),
                          ("[[1]]", "task 0: expected an object")):
        path.write_text(text)
        with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
            load_tot_file(str(path))
    two = tmp_path / "two.json"
    two.write_text(json.dumps(EDGE_CASES))
    with pytest.raises(ValueError, match="tasks=9, the file holds 2 tasks"):
        load_tot_file(str(two), tasks=9)


# -- GPU: the same checks, bigger scale, CUDA (fp32 with the torch reference attention;
# fp16 with treeattn's planners, eager and with CUDA graphs) ------------------------------

GPU_CASES = [("torch-ref", "fp32", False), ("auto", "fp16", False), ("auto", "fp16", True),
             ("per-query", "fp16", True)]


def gpu_model(folder, attention, dtype):
    if attention != "torch-ref":
        pytest.importorskip("treeattn._treeattn")
    return load_model(folder, device="cuda", dtype=dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention,dtype,graphs", GPU_CASES)
@pytest.mark.parametrize("name", FILES)
def test_gpu_replay(models, name, attention, dtype, graphs):
    hf, folder = models
    model = gpu_model(folder, attention, dtype)
    spec = f"tot:file={workload(name)},tasks=4,scale=0.05"
    program, result = run_checked(model, spec, attention=attention, page_size=16, graphs=graphs)
    check_replay_shape(program, result)
    if dtype == "fp32":
        assert check_logits(hf, result, atol=GPU_FP32_ATOL) > 500
    else:
        assert check_logits(hf, result, rtol=GPU_FP16_RTOL) > 500


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention,dtype,graphs", GPU_CASES)
def test_gpu_live(models, attention, dtype, graphs):
    hf, folder = models
    model = gpu_model(folder, attention, dtype)
    _, result = run_checked(model, "tot-live:prompt=40,tasks=3,rounds=3,width=2,k=4,budget=20",
                            attention=attention, page_size=16, graphs=graphs)
    assert result.batch_sizes == [3 * 4] * 20 + [3 * 2 * 4] * 40
    if dtype == "fp32":
        check_logits(hf, result, atol=GPU_FP32_ATOL)
    else:
        check_logits(hf, result, rtol=GPU_FP16_RTOL)
