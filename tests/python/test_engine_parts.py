"""Engine parts on their own: the TorchTreeAttention reference against dense attention over
each query's materialised context (tree plans and block tables), PyRadixCache invariants over
random operation sequences, sampling, the named random shapes and the CLI."""
import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from treeattn.engine import (PyRadixCache, SamplingParams, TorchTreeAttention, build_engine,
                             load_model, make_program, named_config, run_program, sample)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def dense(q, k, v, scale):
    """q [Hq, D]; k, v [L, Hkv, D] -> [Hq, D] in fp64."""
    group = q.shape[0] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    p = torch.softmax(torch.einsum("hd,lhd->hl", q.double(), k) * scale, -1)
    return torch.einsum("hl,lhd->hd", p, v)


def test_torch_tree_attention_matches_dense():
    torch.manual_seed(0)
    ps, pages, hq, hkv, d = 4, 16, 4, 2, 8
    kp = torch.randn(pages, ps, hkv, d)
    vp = torch.randn(pages, ps, hkv, d)
    # root (6 tokens, pages 3,7) -> a (4 tokens, page 1) -> c (1, page 9); root -> b (5, pages 2,4)
    parents, ntok = [-1, 0, 0, 1], [6, 4, 5, 1]
    offsets, page_ids = [0, 2, 3, 5, 6], [3, 7, 1, 2, 4, 9]
    queries = [3, 2, 1, 0]
    attn = TorchTreeAttention(hq, hkv, d, ps, pages, dtype="fp32")
    attn.plan_tree(np.array(parents, np.int32), ntok, offsets, page_ids, queries)
    q = torch.randn(4, hq, d)
    out, lse = attn.run(q, kp, vp, return_lse=True)
    rows = kp.reshape(-1, hkv, d), vp.reshape(-1, hkv, d)
    root = [3 * 4 + i for i in range(4)] + [7 * 4, 7 * 4 + 1]
    paths = [root + [4, 5, 6, 7] + [36], root + [8, 9, 10, 11, 16], root + [4, 5, 6, 7], root]
    for i, path in enumerate(paths):
        ref = dense(q[i], rows[0][path], rows[1][path], d ** -0.5)
        assert torch.allclose(out[i].double(), ref, atol=1e-5)
    assert torch.isfinite(lse).all()
    # the same contexts as block tables give the same output
    tables = np.zeros((1, 3), np.int32)
    tables[0] = [3, 7, 1]
    attn.plan_block_tables(tables, [6])
    assert torch.allclose(attn.run(q[3:4], kp, vp), out[3:4], atol=1e-6)


def test_torch_tree_attention_rejects_bad_plans():
    attn = TorchTreeAttention(4, 2, 8, 4, 16, max_queries=2)
    with pytest.raises(ValueError, match=r"num_tokens\[0\]: 6 tokens need 2 pages"):
        attn.plan_tree([-1], [6], [0, 1], [3], [0])
    with pytest.raises(ValueError, match=r"query_nodes\[0\]: node 5 out of range"):
        attn.plan_tree([-1], [3], [0, 1], [3], [5])
    with pytest.raises(ValueError, match="query_nodes: 3 exceeds the capacity 2"):
        attn.plan_tree([-1], [3], [0, 1], [3], [0, 0, 0])


def test_py_radix_cache_random_operations():
    rng = random.Random(0)
    ps, cache = 2, PyRadixCache(40, 2)
    alphabet = [1, 2, 3]
    held = []   # (node, tokens) locked by "requests"
    for _ in range(400):
        op = rng.random()
        tokens = [rng.choice(alphabet) for _ in range(rng.randrange(0, 12))]
        if op < 0.5:
            node, n, pages = cache.match_prefix(tokens)
            assert n % ps == 0 and len(pages) == n // ps and n <= len(tokens)
            full = len(tokens) // ps * ps
            try:
                new = cache.alloc((full - n) // ps)
            except ValueError:
                continue
            node = cache.insert(tokens[:full], list(pages) + list(new))
            again, m, pages2 = cache.match_prefix(tokens[:full])
            assert again is node and m == full and len(pages2) == full // ps
            cache.lock(node)
            held.append(node)
        elif op < 0.8 and held:
            cache.unlock(held.pop(rng.randrange(len(held))))
        else:
            cache.evict(rng.randrange(1, 6))
        cache.check()
        parents, ntok, offsets, page_ids, index = cache.export_tree(held)
        assert all(p < i for i, p in enumerate(parents))   # parents first
        assert len(set(page_ids.tolist())) == len(page_ids)
        assert all(ntok[i] == (offsets[i + 1] - offsets[i]) * ps for i in range(len(ntok)))
    for node in held:
        cache.unlock(node)
    cache.evict(40)
    cache.check()
    assert cache.num_free_pages() == 40


def test_sampling():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen)
    greedy = logits.argmax(-1)
    assert torch.equal(sample(logits, SamplingParams()), greedy)
    assert torch.equal(sample(logits, SamplingParams(1.0, top_k=1), gen), greedy)
    assert torch.equal(sample(logits, SamplingParams(1.0, top_p=1e-6), gen), greedy)
    draws = [sample(logits, SamplingParams(0.7, 0.9, 20), torch.Generator().manual_seed(5))
             for _ in range(2)]
    assert torch.equal(*draws)   # seeded
    top20 = logits.topk(20).indices
    many = sample(logits.repeat(200, 1), SamplingParams(2.0, 1.0, 20), gen).view(200, 3)
    assert all(bool(torch.isin(many[:, i], top20[i]).all()) for i in range(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_draws_from_the_softmax(dtype):
    """The exponential race draws token i with probability softmax(logits / T)[i] (to
    within 4 standard deviations over 40000 draws), never a -inf logit, in the logits'
    dtype; top-k keeps the k largest in proportion."""
    logits = torch.tensor([[0.0, 1.0, 2.0, float("-inf"), -1.0]], dtype=dtype)
    n, gen = 40000, torch.Generator().manual_seed(1)
    for params, kept in ((SamplingParams(0.5), [0, 1, 2, 4]), (SamplingParams(0.5, top_k=2), [1, 2])):
        draws = sample(logits.expand(n, -1), params, gen)
        freq = torch.bincount(draws, minlength=5).double() / n
        probs = torch.zeros(5, dtype=torch.float64)
        probs[kept] = torch.softmax(logits[0, kept].double() / params.temperature, dim=0)
        sd = (probs * (1 - probs) / n).sqrt()
        assert ((freq - probs).abs() <= 4 * sd + 1e-12).all(), (params, freq, probs)
        assert freq[3] == 0


def test_named_shapes_are_real():
    llama = named_config("llama3-8b")
    assert (llama.num_layers, llama.num_heads, llama.num_kv_heads, llama.hidden_size,
            llama.intermediate_size, llama.vocab_size) == (32, 32, 8, 4096, 14336, 128256)
    qwen = named_config("qwen2.5-7b")
    assert qwen.attention_bias and (qwen.num_heads, qwen.num_kv_heads) == (28, 4)


def test_bf16_engine_runs_close_to_fp32():
    fp32 = load_model("random:tiny", dtype="fp32")
    bf16 = load_model("random:tiny", dtype="bf16")
    program = make_program("shared:prompt=17,branches=2,question=2,gen=4", 512)
    results = [run_program(build_engine(m, "torch-ref", "py", page_size=4, num_pages=64),
                           program, record_logits=True) for m in (fp32, bf16)]
    # the first step only: its inputs are the same in both; later steps may have
    # picked different greedy tokens (near-ties round differently in bf16)
    for a, b in zip(results[0].logits, results[1].logits):
        assert (a[0] - b[0].float()).norm() / a[0].norm() < 0.05


def test_cli_json():
    env = dict(os.environ)  # the installed treeattn, as the tests import it
    out = subprocess.run(
        [sys.executable, "-m", "treeattn.engine", "--model", "random:tiny", "--program",
         "two-level:system=8,docs=2,doc=8,questions=2,question=2,gen=4", "--attention",
         "torch-ref", "--cache", "py", "--device", "cpu", "--dtype", "fp32", "--page-size",
         "4", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["steps"] == 3 and report["sequences"] == 4
    for key in ("tokens_per_s", "tpot_ms_median", "tpot_ms_p90", "attention_share"):
        assert report[key] > 0
    assert "decode step 3/3" in out.stderr


def test_shared_prefix_is_stored_once():
    model = load_model("random:tiny", dtype="fp32")
    engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=128)
    program = make_program("two-level:system=16,docs=2,doc=8,questions=3,question=2,gen=3", 512)
    result = run_program(engine, program, steps=1)
    parents, ntok, offsets, pages, queries = engine.forest(result.seqs)
    lengths = [s.kv_len + 1 for s in result.seqs]
    # the forest holds each distinct token once: system (16) + 2 docs (8) + 6 question tails
    assert sum(ntok) < sum(lengths)
    assert sum(ntok) == 16 + 2 * 8 + sum(n - 24 for n in lengths)
    assert len(set(pages.tolist())) == len(pages)
    assert len(queries) == 6 and (parents[queries] >= 0).all()


@pytest.mark.parametrize("cache", ["py", "cpp"])
def test_prepared_decode_matches_unprepared(cache):
    """Engine.prepare() (the next step's slots, forest and plan, built while a step runs)
    gives the same logits as planning inside decode(); the cached forest equals a fresh
    one at every step; a changed batch (a sequence released) falls back to planning."""
    if cache == "cpp":
        pytest.importorskip("treeattn._treeattn")
    model = load_model("random:tiny", dtype="fp32")
    runs = []
    for prepare in (True, False):
        engine = build_engine(model, "torch-ref", cache, page_size=4, num_pages=128)
        seqs = []
        for prompt in ([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]):
            seq, logits = engine.add(prompt)
            seqs += engine.fork(seq, 2)
            for s in seqs[-2:]:
                s.tokens.append(int(logits.argmax()))
        rows = []
        for step in range(9):
            if step == 5:                     # prepared for 4 sequences, decoding 3
                engine.release(seqs.pop(1))
            logits = engine.decode(seqs)
            if prepare:
                assert engine.prepare(seqs)
            fresh = [a.copy() for a in engine.forest(seqs)]
            engine._fc = None
            for a, b in zip(fresh, engine.forest(seqs)):
                assert np.array_equal(a, b)
            rows.append(logits)
            for s, tok in zip(seqs, logits.argmax(-1).tolist()):
                s.tokens.append(tok)
        runs.append(rows)
        for s in seqs:
            engine.release(s)
        engine.cache.check()
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_fused_projections_are_views_of_one_weight():
    """q/k/v and gate/up run as one product each; the Hugging Face parameters stay (views of
    the fused weight), so state_dict and loading are unchanged; .to() drops the fusion and
    the next forward fuses again, with the same logits."""
    from treeattn.engine.model import CausalLM
    model = load_model("random:tiny", dtype="fp32")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    w, b = attn.qkv
    assert attn.q_proj.weight.data_ptr() == w.data_ptr()
    assert attn.v_proj.weight.data_ptr() == w[-attn.v_proj.weight.shape[0]:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up[mlp.gate_proj.weight.shape[0]:].data_ptr()
    names = set(model.state_dict())
    assert "model.layers.0.self_attn.k_proj.weight" in names and not any("qkv" in n for n in names)
    # a fresh unfused model with the same state gives the same logits
    fresh = CausalLM(model.cfg)
    fresh.load_state_dict(model.state_dict())
    assert fresh.model.layers[0].self_attn.qkv is None
    ids = torch.tensor([3, 1, 4, 1, 5])
    def logits(m):
        eng = build_engine(m, "torch-ref", "py", page_size=4, num_pages=16)
        seq, out = eng.add(ids.tolist())
        return out
    before = logits(model)
    torch.testing.assert_close(before, logits(fresh), rtol=0, atol=1e-6)
    model.to("cpu")
    assert attn.qkv is None and mlp.gate_up is None
    torch.testing.assert_close(logits(model), before, rtol=0, atol=0)
    assert attn.q_proj.weight.data_ptr() == attn.qkv[0].data_ptr()


def test_choose_ops():
    from treeattn.engine.ops import EAGER, choose_ops
    assert choose_ops("off", "cpu") is EAGER and choose_ops("auto", "cpu") is EAGER
    with pytest.raises(ValueError, match="compile: expected auto, on or off"):
        choose_ops("maybe", "cpu")
    with pytest.raises(ValueError, match="compile: on needs a cuda device"):
        choose_ops("on", "cpu")


def test_graph_buckets_pad_at_most_a_quarter():
    from treeattn.engine.graphs import buckets_up_to
    assert buckets_up_to(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert buckets_up_to(1) == [1]
    for n in range(1, 3000):
        sizes = buckets_up_to(n)
        assert sizes == sorted(set(sizes)) and sizes[-1] == n
        for m in (n, n // 2 + 1):
            b = next(s for s in sizes if s >= m)
            assert m <= 32 or b <= 1.25 * m, (n, m, b)


@pytest.mark.parametrize("num_queries", [None, 8])
def test_forest_update_in_place_equals_rebuild(num_queries, monkeypatch):
    """A forest kept from step to step (tails gaining pages at different steps: prompts of
    several lengths, 4-token pages; padded to num_queries or not) equals one built afresh."""
    from treeattn.engine.engine import _ForestCache
    grown = []
    grow = _ForestCache._grow
    monkeypatch.setattr(_ForestCache, "_grow", lambda fc, *a: grown.append(grow(fc, *a)) or grown[-1])
    model = load_model("random:tiny", dtype="fp32")
    engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=256, max_batch=8)
    gen = np.random.default_rng(1)
    shared = gen.integers(0, 100, 9).tolist()
    seqs = []
    for n in (1, 2, 5, 6, 11):
        seq, logits = engine.add(shared + gen.integers(0, 100, n).tolist())
        seq.tokens.append(int(logits.argmax()))
        seqs.append(seq)
    kept = None
    for _ in range(12):
        for s in seqs:
            engine._reserve_slot(s)
        counts = np.array([s.kv_len + 1 - s.cached_len for s in seqs])
        kept = kept or _ForestCache(engine, seqs, num_queries)
        kept.update(seqs, counts, engine.page_size)
        fresh = _ForestCache(engine, seqs, num_queries)
        fresh.update(seqs, counts, engine.page_size)
        for name in ("parents", "ntok", "offsets", "pages", "queries"):
            np.testing.assert_array_equal(getattr(kept, name), getattr(fresh, name), err_msg=name)
        logits = engine.decode(seqs)
        for s, row in zip(seqs, logits):
            s.tokens.append(int(row.argmax()))
    assert grown.count(True) >= 3   # the in-place path ran on several steps


def test_py_radix_cache_refuses_what_the_cpp_cache_refuses_and_changes_nothing():
    """PyRadixCache as the C++ RadixCache: a double free, a free of a cached page, an insert of
    a free page or of a page cached elsewhere, an unlock of a node that is not locked itself,
    a lock of an evicted node and alloc(-1) are ValueErrors, and an alloc that cannot be met
    evicts nothing. Before: the double free put page 0 on the free list twice (alloc then
    handed it to two requests), unlock dropped the parent's lock before raising, insert took
    the free or cached page (two owners), and the failed alloc emptied the cache."""
    ps = 2

    def state(c):
        return list(c._free), [(n.key, tuple(n.pages), n.ref) for n in c._nodes()]

    c = PyRadixCache(6, ps)
    p = [int(x) for x in c.alloc(3)]
    leaf = c.insert([1, 2, 3, 4], p[:2])            # nodes [1, 2] -> [3, 4] once split
    top, _, _ = c.match_prefix([1, 2])
    c.lock(top)
    held = p[2]                                      # handed out, not cached
    before = state(c)
    refused = [
        (lambda: c.free([p[0]]), "is cached"),
        (lambda: c.free([held, held]), "already free"),
        (lambda: c.free([5]), "already free"),
        (lambda: c.free([6]), "out of range"),
        (lambda: c.unlock(leaf), "not locked"),
        (lambda: c.insert([7, 7], [5]), "is free"),
        (lambda: c.insert([7, 7, 8, 8], [held, p[1]]), "cached by another node"),
        (lambda: c.insert([1, 2, 9, 9], [p[0], p[0]]), "listed twice"),
        (lambda: c.alloc(-1), "must be >= 0"),
        (lambda: c.alloc(6), "6 pages requested, 3 free \\+ 1 evictable"),
    ]
    for call, text in refused:
        try:
            call()
        except ValueError as e:
            assert re.search(text, str(e)), (text, str(e))
        else:
            pytest.fail(f"accepted, expected ValueError: {text}")
        assert state(c) == before, text
        c.check()
    c.free([held])
    assert sorted(int(x) for x in c.alloc(5)) == [1, 2, 3, 4, 5]   # each page once, leaf evicted
    with pytest.raises(ValueError, match="not a live node"):  # leaf was evicted by that alloc
        c.lock(leaf)
    c.unlock(top)
    c.check()
