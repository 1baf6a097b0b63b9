"""Speculative decoding with token trees on the engine (issue 19, section 2): the topology
parser and n-gram drafting; greedy speculative output == plain greedy decoding (>= 128
tokens, a repetitive prompt so drafts are accepted); every draft's verification logits ==
transformers' forward over the request's tokens plus the draft path; two requests sharing a
prompt verified in one plan; bad input -> ValueError naming the field, cache unchanged.
CPU tests run fp32 with the torch-ref attention (and the treeattn CPU executor in fp16);
the gpu-marked ones run treeattn's CUDA attention."""
import json
import os
import re
import time

import pytest
import torch

from hf_models import save, tiny_hf_model
from treeattn.engine import build_engine, load_model, run_program
from treeattn.engine.contexts import DecodeContext
from treeattn.engine.graphs import GraphRunner
from treeattn.engine.drafting import Draft, NgramIndex, Topology, draft_tree, load_topology
from treeattn.engine.speculative import (parse_spec_program, run_speculative,
                                         spec_pages_needed, verify)

# the recorded Medusa trees (also in ../shared/workloads), as tests/tree/test_recorded.cpp finds them
WORKLOADS = os.environ.get("TREEATTN_WORKLOADS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../data/workloads")
ATOL = 1e-4          # fp32 engine vs fp32 transformers, as in test_engine_hf.py
FP16_ATOL = 5e-2     # fp16 engine vs fp32 transformers (fp16 rounding, see test_engine_hf.py)
CUDA = torch.cuda.is_available()


def medusa(size):
    return f"{WORKLOADS}/APPS_tree_size{size}.json"


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    hf = tiny_hf_model("llama3")
    folder = save(hf, tmp_path_factory.mktemp("llama3"))
    return hf, folder


def make_engine(model, spec, attention="torch-ref", cache="cpp", page_size=4, max_draft=64,
                graphs=False):
    pages = spec_pages_needed(spec, page_size, max_draft)
    engine = build_engine(model, attention, cache, page_size=page_size, num_pages=pages,
                          max_batch=len(spec.program.prompts), graphs=graphs == "cuda",
                          max_drafts=len(spec.program.prompts) * max_draft)
    if graphs == "eager":
        engine.graphs = EagerBuckets(engine)
    return engine


class EagerBuckets:
    """GraphRunner's part in a verification step, run eagerly (CPU): a bucket larger than
    the step, padded with GraphRunner's own padding, so the padded layout (pending tokens,
    padding queries, drafts) is checked without a GPU."""
    pad = GraphRunner.pad

    def __init__(self, engine):
        self.engine, self.scratch_row = engine, engine.scratch_page * engine.page_size

    def bucket(self, n):
        return min(n + 5, self.engine.max_tokens)

    def ensure(self, b):   # one "graph" (this eager run) serves every plan
        pass

    def replay(self, b):
        e = self.engine
        t = e._upload()
        return e.model(t[0, :b], t[1, :b], t[2, :b], e.kv, DecodeContext(e.attention))


def release_all(engine, seqs, free_before):
    """Release seqs and evict the cached prompts: every page is free again."""
    for s in seqs:
        engine.release(s, publish=False)
    engine.cache.check()
    engine.cache.evict(engine.capacity)
    assert engine.cache.num_free_pages() == free_before


# -- topologies and drafting -------------------------------------------------------------

@pytest.mark.parametrize("size", [32, 64, 128])
def test_recorded_medusa_topologies(size):
    topology = load_topology(medusa(size))
    with open(medusa(size)) as f:
        recorded = json.load(f)["Tree_Structure"]
    assert len(topology) == size - 1 == len(recorded)   # Token_Tree_size counts the root
    assert sorted(map(tuple, recorded)) == topology.paths
    for i, (parent, path) in enumerate(zip(topology.parents, topology.paths)):
        assert parent < i and (parent == -1 or topology.paths[parent] == path[:-1])
    # the all-top-ranked path first: accepted, it needs no KV copy
    assert topology.paths[:3] == [(0,), (0, 0), (0, 0, 0)]


def test_topology_order_and_width_depth():
    t = Topology.from_medusa({"Tree_Structure": [[1], [0], [1, 0], [0, 0], [0, 1]]})
    assert t.paths == [(0,), (0, 0), (0, 1), (1,), (1, 0)]
    assert (t.parents, t.ranks, t.depths) == ([-1, 0, 0, -1, 3], [0, 0, 1, 1, 0], [1, 2, 2, 1, 2])
    assert t.fanout == {-1: 2, 0: 2, 3: 1}
    wd = load_topology("16x16")
    assert len(wd) == 256 and max(wd.depths) == 16 and wd.fanout[-1] == 16
    assert wd.paths[:2] == [(0,), (0, 0)] and wd.paths[16] == (1,)


@pytest.mark.parametrize("record, field", [
    ([[0]], "Tree_Structure"),                                        # not an object
    ({"Token_Tree_size": 2}, "Tree_Structure"),                       # missing
    ({"Tree_Structure": []}, "Tree_Structure"),                       # empty
    ({"Tree_Structure": [[0], 3]}, "Tree_Structure[1]"),              # a path not a list
    ({"Tree_Structure": [[0], [-1]]}, "Tree_Structure[1]"),           # negative rank
    ({"Tree_Structure": [[0], ["a"]]}, "Tree_Structure[1]"),          # not an int
    ({"Tree_Structure": [[0], [0]]}, "Tree_Structure[1]"),            # twice
    ({"Tree_Structure": [[0], [1, 0, 2]]}, "Tree_Structure[1]"),      # no parent path
    ({"Tree_Structure": [[0], [1]], "Token_Tree_size": 7}, "Token_Tree_size"),
    ({"Tree_Structure": [[0]], "Token_Tree_size": True}, "Token_Tree_size"),   # a bool, not 1
])
def test_malformed_topology_file(tmp_path, record, field):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="^" + re.escape(field)):
        load_topology(str(path))


def test_unreadable_topology_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for spec in (str(tmp_path / "bad.json"), str(tmp_path / "missing.json"), "0x4"):
        with pytest.raises(ValueError, match="^tree"):
            load_topology(spec)


def test_ngram_candidates_and_drafts():
    index = NgramIndex([5, 6, 7, 5, 6, 8, 5, 6, 7, 9, 5], max_n=2)
    # after (5,): 6 three times; after (5, 6): 7 twice (last at 8), 8 once
    assert index.candidates([1, 5], 3) == [6]
    assert index.candidates([5, 6], 3) == [7, 8]         # (6,) adds nothing new
    assert index.candidates([1, 2], 3) == []
    t = Topology.from_medusa({"Tree_Structure": [[0], [1], [0, 0], [1, 0], [0, 0, 0]]})
    # after 5: only 6, so [1] and [1, 0] are dropped; after 5 6: 7; after 6 7: 9 (the
    # most recent of two seen once)
    assert draft_tree(t, index) == Draft([6, 7, 9], [-1, 0, 1])
    assert draft_tree(t, index, max_depth=2) == Draft([6, 7], [-1, 0])
    filled = draft_tree(t, index, fill=True)
    assert len(filled) == len(t) and filled.tokens[3] == 1   # filler: the rank


# -- speculative == plain greedy ---------------------------------------------------------

def spec_vs_greedy(model, spec_text, attention="torch-ref", cache="cpp", page_size=4,
                   graphs=False):
    spec = parse_spec_program(spec_text, model.cfg.vocab_size, seed=1, workloads=WORKLOADS)
    plain = run_program(make_engine(model, spec, attention, cache, page_size), spec.program)
    engine = make_engine(model, spec, attention, cache, page_size, graphs=graphs)
    free = engine.cache.num_free_pages()
    result = run_speculative(engine, spec)
    for a, b in zip(plain.seqs, result.seqs):
        assert b.tokens == a.tokens and len(b.tokens) - b.prompt_len == spec.program.gen
        assert b.kv_len == len(b.tokens) - 1
    release_all(engine, result.seqs, free)
    return result


@pytest.mark.parametrize("tree", ["APPS_tree_size64.json", "4x6"])
def test_spec_equals_greedy(tree):
    model = load_model("random:tiny", dtype="fp32")
    result = spec_vs_greedy(
        model, f"spec:prompt=45,requests=3,question=3,repeat=9,gen=130,tree={tree}")
    accepted = sum(map(sum, result.accepted))
    assert accepted > 0, "the repetitive prompt should get drafts accepted"
    # every accepted draft saves a step: plain decoding takes gen - 1 = 129 steps
    assert len(result.step_seconds) < 129


def test_attention_timing_is_off_the_step_clock():
    """engine.attention_seconds (with CUDA graphs: the attention run once more, outside the
    graph) is instrumentation: run_speculative calls it after the step's clock stopped, for
    the step's queries (pending tokens + drafts), as run_program does for plain steps."""
    model = load_model("random:tiny", dtype="fp32")
    spec = parse_spec_program("spec:prompt=45,requests=2,question=3,repeat=9,gen=12,tree=4x6",
                              model.cfg.vocab_size, seed=1, workloads=WORKLOADS)
    engine = make_engine(model, spec)
    asked = []

    def slow_timing(n):
        asked.append(n)
        time.sleep(0.25)
        return 1e-3

    engine.attention_seconds = slow_timing
    result = run_speculative(engine, spec, steps=3, time_attention=True)
    assert result.attention_seconds == [1e-3] * len(result.verify_seconds)
    assert max(result.step_seconds) < 0.25, result.step_seconds
    assert asked == [len(ds) + sum(ds) for ds in result.drafted]


def test_spec_equals_greedy_padded_like_graphs():
    # the layout of a CUDA-graph verification step: padding queries between the pending
    # tokens and the drafts
    model = load_model("random:tiny", dtype="fp32")
    result = spec_vs_greedy(model, "spec:prompt=45,requests=3,question=3,repeat=9,gen=128,"
                                   "tree=APPS_tree_size32.json", graphs="eager")
    assert sum(map(sum, result.accepted)) > 0


def test_spec_equals_greedy_hf_model_py_cache(hf_llama):
    model = load_model(hf_llama[1], dtype="fp32")
    result = spec_vs_greedy(model, "spec:prompt=30,requests=2,question=2,repeat=6,gen=128,"
                                   "tree=APPS_tree_size32.json", cache="py")
    assert sum(map(sum, result.accepted)) > 0


# -- verification logits vs transformers ----------------------------------------------------

def hf_last_logits(hf, tokens):
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens])).logits[0, -1].float()


def hf_greedy(hf, tokens, n):
    ids = torch.tensor([tokens])
    with torch.no_grad():   # an explicit mask: else generate() masks prompt tokens equal to pad_token_id
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                          pad_token_id=0)
    return out[0, len(tokens):].tolist()


def check_verify_logits(hf, model, attention, atol, page_size=4, steps=4, graphs=False):
    """Each request's draft: a full topology (n-gram candidates, fillers where there are
    none), then transformers' own greedy continuation as a last branch: accepted, so its
    KV rows (after the other drafts') are copied to the accepted positions, which the next
    step's logits check."""
    spec = parse_spec_program("spec:prompt=21,requests=2,question=3,repeat=5,gen=40",
                              model.cfg.vocab_size, seed=2)
    topology = Topology.from_medusa({"Tree_Structure": [[0], [1], [2], [0, 0], [0, 1],
                                                        [1, 0], [0, 0, 0], [0, 1, 0]]})
    engine = make_engine(model, spec, attention, page_size=page_size,
                         max_draft=len(topology) + 3, graphs=graphs)
    copies = []
    copy_rows = engine.kv.copy_rows
    engine.kv.copy_rows = lambda src, dst: (copies.append(len(src)), copy_rows(src, dst))
    seqs = []
    for prompt in spec.program.prompts:
        seq, logits = engine.add(prompt)
        seq.tokens.append(int(logits.argmax()))
        seqs.append(seq)
    accepted = 0
    for _ in range(steps):
        drafts = []
        for s in seqs:
            d = draft_tree(topology, NgramIndex(s.tokens), fill=True)
            n = len(d)
            drafts.append(Draft(d.tokens + hf_greedy(hf, s.tokens, 3), d.parents + [-1, n, n + 1]))
        before = [list(s.tokens) for s in seqs]          # ends with the pending token
        out = verify(engine, seqs, drafts, return_logits=True)
        for tokens, d, logits in zip(before, drafts, out.logits):
            assert logits.shape[0] == 1 + len(d)
            paths = {-1: []}
            for j, (token, parent) in enumerate(zip(d.tokens, d.parents)):
                paths[j] = paths[parent] + [token]
            for row, j in enumerate([-1] + list(range(len(d)))):
                ref = hf_last_logits(hf, tokens + paths[j])
                err = (logits[row].float().cpu() - ref).abs().max().item()
                assert err <= atol, f"draft {j}: max |verify - transformers| = {err}"
        accepted += sum(out.accepted)
    assert accepted > 0 and copies, "accepted drafts (and copied KV rows) expected"
    return accepted


def test_verification_logits_match_transformers(hf_llama):
    hf, folder = hf_llama
    steps, requests, chain = 4, 2, 3
    # fp32: the greedy chain is accepted whole, at every step, by every request
    assert check_verify_logits(hf, load_model(folder, dtype="fp32"), "torch-ref", ATOL,
                               steps=steps) == steps * requests * chain


@pytest.mark.parametrize("attention", ["auto", "per-query"])
def test_verification_logits_treeattn_cpu_executor(hf_llama, attention):
    # treeattn's own plan_tree_queries on its CPU executor (fp16 inputs, fp32 math)
    hf, folder = hf_llama
    check_verify_logits(hf, load_model(folder, dtype="fp16"), attention, FP16_ATOL,
                        page_size=16, steps=2)


# -- two requests, one plan ----------------------------------------------------------------

def test_two_requests_share_one_plan():
    model = load_model("random:tiny", dtype="fp32")
    spec = parse_spec_program("spec:prompt=24,requests=2,question=2,gen=8,tree=2x2",
                              model.cfg.vocab_size)
    engine = make_engine(model, spec)
    plans = []
    plan = engine.attention.plan_tree_queries

    def spy(parents, num_tokens, page_offsets, page_ids, query_nodes, **drafts):
        plans.append((list(parents), list(query_nodes), {k: list(v) for k, v in drafts.items()}))
        return plan(parents, num_tokens, page_offsets, page_ids, query_nodes, **drafts)
    engine.attention.plan_tree_queries = spy
    seqs = [engine.add(p)[0] for p in spec.program.prompts]
    for s in seqs:
        s.tokens.append(0)
    drafts = [Draft([1, 2, 3], [-1, 0, -1]), Draft([4, 5], [-1, 0])]
    out = verify(engine, seqs, drafts, return_logits=True)
    assert len(plans) == 1
    parents, queries, d = plans[0]
    assert len(queries) == 2 and parents[queries[0]] == parents[queries[1]] >= 0, \
        "both tail nodes hang under the shared prompt's node"
    assert d["draft_nodes"] == [queries[0]] * 3 + [queries[1]] * 2
    assert d["draft_parents"] == [-1, 0, -1, -1, 3]
    assert len(engine.attention.rows) == 2 + 5 and [len(x) for x in out.logits] == [4, 3]


# -- bad input: ValueError naming the field, nothing changed -----------------------------

BAD_DRAFTS = [
    (Draft([1, 2], [1, 0]), r"drafts\[{i}\]\.parents\[0\]: parent 1 makes a cycle"),
    (Draft([1, 2], [-1, 2]), r"drafts\[{i}\]\.parents\[1\]: parent 2 is outside"),
    (Draft([1, 2], [-1, -2]), r"drafts\[{i}\]\.parents\[1\]: parent -2 is outside"),
    (Draft([1, 2, 3], [1, -1, 0]), r"drafts\[{i}\]\.parents\[0\]: parent 1 is listed after"),
    (Draft([1, 2], [-1]), r"drafts\[{i}\]\.tokens"),
    (Draft([1, 10 ** 6], [-1, 0]), r"drafts\[{i}\]\.tokens: 1000000 is outside the vocabulary"),
    (Draft([1] * 400, [-1] + list(range(399))), r"drafts\[{i}\]: KV cache full"),  # > the pool
    (Draft([1] * 1200, [-1] * 1200), r"drafts: 2 pending tokens \+ 1202 drafts exceed"),
]


@pytest.mark.parametrize("attention", ["torch-ref", "auto"])
def test_bad_drafts_leave_the_cache_consistent(attention):
    dtype, page_size = ("fp32", 4) if attention == "torch-ref" else ("fp16", 16)
    model = load_model("random:tiny", dtype=dtype)
    spec = parse_spec_program("spec:prompt=30,requests=2,question=2,repeat=5,gen=40,tree=3x4",
                              model.cfg.vocab_size)
    # room for 1000 drafts a step, but pages for 24 a request: too large a draft fails
    engine = build_engine(model, attention, "cpp", page_size=page_size,
                          num_pages=spec_pages_needed(spec, page_size, 24), max_batch=2,
                          max_drafts=1000)
    free = engine.cache.num_free_pages()
    seqs = [engine.add(p)[0] for p in spec.program.prompts]
    for s in seqs:
        s.tokens.append(7)
    ok = Draft([7, 7], [-1, 0])

    def check_unchanged(drafts, message):
        state = [(list(s.tokens), s.kv_len, list(s.tail)) for s in seqs]
        pages = engine.cache.num_free_pages()
        with pytest.raises((ValueError, RuntimeError), match=message):
            verify(engine, seqs, drafts)
        engine.cache.check()
        assert engine.cache.num_free_pages() == pages
        assert state == [(list(s.tokens), s.kv_len, list(s.tail)) for s in seqs]

    for bad, message in BAD_DRAFTS:
        # the bad draft second: the first request's pages are reserved, then given back
        check_unchanged([bad, ok], message.replace("{i}", "0"))
        check_unchanged([ok, bad], message.replace("{i}", "1"))
    check_unchanged([ok], "drafts: expected one per sequence")
    forward = engine.model.forward

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("no memory")
    engine.model.forward = out_of_memory   # a failing forward changes nothing either
    check_unchanged([ok, ok], "no memory")
    engine.model.forward = forward
    out = verify(engine, seqs, [ok, ok])            # still usable afterwards
    assert all(len(t) >= 1 for t in out.tokens)
    release_all(engine, seqs, free)


def test_bad_spec_program():
    with pytest.raises(ValueError, match="bad parameter"):
        parse_spec_program("spec:prompt=4,width=3", 100)
    with pytest.raises(ValueError, match="gen"):
        parse_spec_program("spec:gen=0", 100)
    with pytest.raises(ValueError, match="not a int"):
        parse_spec_program("spec:requests=x", 100)


# -- GPU -----------------------------------------------------------------------------------

@pytest.mark.parametrize("graphs", [False, "cuda"])
@pytest.mark.parametrize("attention", ["auto", "per-query"])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_verification_logits(hf_llama, attention, graphs):
    hf, folder = hf_llama
    check_verify_logits(hf, load_model(folder, device="cuda", dtype="fp16"), attention,
                        FP16_ATOL, page_size=16, graphs=graphs)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_spec_equals_greedy_fp32():
    # the engine's bookkeeping on a CUDA device (KV copies, page trims), exact in fp32
    model = load_model("random:tiny", device="cuda", dtype="fp32")
    spec_vs_greedy(model, "spec:prompt=200,requests=8,question=4,repeat=13,gen=128,"
                          "tree=APPS_tree_size64.json", page_size=16)


@pytest.mark.parametrize("graphs", [False, "cuda"])
@pytest.mark.parametrize("attention", ["auto", "per-query"])
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_treeattn_spec_equals_greedy(attention, graphs):
    """bf16 treeattn: speculative tokens equal plain greedy ones up to where plain decoding's
    top two logits are within bf16 noise of each other (there a different but equally valid
    batch shape may flip the argmax). On random:tiny, |bf16 - fp32| logits ~0.01 (measured
    on the CPU executor) for logits of magnitude ~1.2, and top-2 gaps go down to 0.001."""
    model = load_model("random:tiny", device="cuda", dtype="bf16")
    spec = parse_spec_program("spec:prompt=300,requests=8,question=4,repeat=11,gen=128,"
                              "tree=APPS_tree_size64.json", model.cfg.vocab_size, seed=1,
                              workloads=WORKLOADS)
    plain = run_program(make_engine(model, spec, attention, page_size=16), spec.program,
                        record_logits=True)
    result = run_speculative(make_engine(model, spec, attention, page_size=16, graphs=graphs),
                             spec)
    assert sum(map(sum, result.accepted)) > 0
    for a, b, logits in zip(plain.seqs, result.seqs, plain.logits):
        gen_a, gen_b = a.tokens[a.prompt_len:], b.tokens[b.prompt_len:]
        same = next((i for i, (x, y) in enumerate(zip(gen_a, gen_b)) if x != y), len(gen_a))
        if same < len(gen_a):
            top2 = logits[same].float().topk(2).values
            assert top2[0] - top2[1] < 0.05, \
                f"differs at generated token {same}, plain top-2 gap {top2[0] - top2[1]}"


# -- the benchmark ---------------------------------------------------------------------------

def test_spec_bench_cpu_smoke(tmp_path):
    from test_engine_bench import load_bench
    bench = load_bench("spec_bench")
    out = tmp_path / "spec_bench.json"
    rc = bench.main(["--model", "random:tiny", "--device", "cpu", "--prompt", "40", "--steps",
                     "2", "--trees", "4x4,APPS_tree_size32.json", "--workloads", WORKLOADS,
                     "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and {"device", "date", "commit", "command"} <= set(report)
    spec = [r for r in report["rows"] if r["kind"] == "spec"]
    assert [(r["attention"], r["queries"]) for r in spec] == [
        ("auto", 8 * 17), ("auto", 8 * 32), ("per-query", 8 * 17), ("per-query", 8 * 32)]
    # fill=1: every step verifies the whole topology
    assert all(r["drafts_per_request_step"] == r["drafts"] and r["break_even_tokens"] > 0
               for r in spec)


def test_cli_spec_program(capsys):
    from treeattn.engine.__main__ import main
    main(["--model", "random:tiny", "--dtype", "fp32", "--attention", "torch-ref", "--device",
          "cpu", "--program", "spec:prompt=40,requests=2,repeat=5,gen=20,tree=2x3", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["tree_size"] == 6 and report["sequences"] == 2 and report["tokens_per_s"] > 0
    steps = [line for line in captured.err.splitlines() if line.startswith("step ")]
    assert len(steps) == report["steps"] and steps[0].startswith("step 1: accepted [")
