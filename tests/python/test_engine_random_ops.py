"""Randomized differential probe of the engine's bookkeeping: several sequences alive at
once under a random interleaving of add (prompts sharing prefixes that end mid-page and at
page boundaries, prompts equal to released texts), fork, decode (with and without ids=),
prepare (then the same batch, another batch or other operations), speculative verify with
random draft trees, publish and release (publish on or off), in a pool small enough that
eviction and "KV cache full" happen.

Oracle: a sequence's tokens fully determine its logits and its K/V rows. Every logits row
the engine returns (add, decode, verify's pending and draft rows) is compared with
transformers' fp32 forward over that row's tokens, and after every operation every live
sequence's K/V rows in the pool (cached prefix and tail) with transformers' keys/values
(after RoPE) of its tokens; plus the engine's page accounting (free + cached + tails =
pool, no page in two places, each sequence's cached pages = its radix path). The
transformers side is incremental (past_key_values) over a trie of token prefixes, so every
prefix is computed once.

Run many seeds by hand (configuration = CONFIGS[seed % 24]):
    python tests/python/test_engine_random_ops.py SEEDS OPS [FIRST_SEED [FILTER]]"""
import os
import random
import sys
import time
from collections import Counter

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_models import save, tiny_hf_model  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from treeattn.engine import build_engine, load_model  # noqa: E402
from treeattn.engine.contexts import DecodeContext  # noqa: E402
from treeattn.engine.graphs import GraphRunner, buckets_up_to  # noqa: E402
from treeattn.engine.drafting import Draft  # noqa: E402
from treeattn.engine.speculative import verify  # noqa: E402

# fp32 engine (torch-ref attention) vs fp32 transformers: the same math in another order,
# observed differences ~1e-6 (test_engine_hf.py); a wrong page or row moves logits by O(1)
FP32_ATOL = 1e-4
# fp16 engine (treeattn's CPU executor, fp16 inputs / fp32 math) vs fp32 transformers:
# fp16 rounding of weights, activations and KV. Over 800 checks of 4 seeds x 200 operations
# the largest differences were 0.047 (logits) and 0.033 (K/V rows, |k| and |v| up to 8),
# not growing with the length; a wrong row or page differs by O(1) (|k| ~ 1-8)
FP16_ATOL = 0.1
# K/V rows: fp32 ~1e-6 observed
FP32_KV_ATOL, FP16_KV_ATOL = 1e-4, 0.1


class _Node:
    __slots__ = ("children", "k", "v", "logits")

    def __init__(self, k, v, logits):
        self.children, self.k, self.v, self.logits = {}, k, v, logits


class Oracle:
    """transformers' fp32 model over token prefixes: per token its K/V rows [layers, Hkv, D]
    (after RoPE) and the logits after it, memoised in a trie; a new suffix runs once on the
    cached K/V of its known prefix."""

    def __init__(self, hf):
        self.hf, self.root = hf, _Node(None, None, None)
        self.layers = hf.config.num_hidden_layers
        self.forwards = 0

    def path(self, tokens):
        nodes, node = [], self.root
        for t in tokens:
            nxt = node.children.get(t)
            if nxt is None:
                break
            nodes.append(nxt)
            node = nxt
        d = len(nodes)
        if d < len(tokens):
            cache = DynamicCache()
            if d:
                k = torch.stack([n.k for n in nodes], 2)    # [layers, Hkv, d, D]
                v = torch.stack([n.v for n in nodes], 2)
                for layer in range(self.layers):
                    cache.update(k[layer][None], v[layer][None], layer)
            ids = torch.tensor([tokens[d:]])
            with torch.no_grad():
                out = self.hf(input_ids=ids, past_key_values=cache, use_cache=True,
                              position_ids=torch.arange(d, len(tokens))[None])
            self.forwards += 1
            pkv = out.past_key_values
            ks = torch.stack([pkv.layers[i].keys[0, :, d:] for i in range(self.layers)])
            vs = torch.stack([pkv.layers[i].values[0, :, d:] for i in range(self.layers)])
            for j in range(len(tokens) - d):
                new = _Node(ks[:, :, j].clone(), vs[:, :, j].clone(), out.logits[0, j].float().clone())
                node.children[tokens[d + j]] = new
                nodes.append(new)
                node = new
        return nodes

    def logits(self, tokens):
        return self.path(tokens)[-1].logits

    def kv(self, tokens):
        """K and V [layers, len(tokens), Hkv, D]."""
        nodes = self.path(tokens)
        return torch.stack([n.k for n in nodes], 1), torch.stack([n.v for n in nodes], 1)

    def greedy(self, tokens, n):
        out = list(tokens)
        for _ in range(n):
            out.append(int(self.logits(out).argmax()))
        return out[len(tokens):]


class EagerGraphs:
    """GraphRunner's part in decode and verification steps without CUDA: a step padded to
    its bucket (padding queries on the scratch page, GraphRunner's own pad()), run eagerly."""
    pad = GraphRunner.pad

    def __init__(self, engine):
        self.engine, self.scratch_row = engine, engine.scratch_page * engine.page_size
        self.buckets = buckets_up_to(engine.max_tokens)

    def bucket(self, n):
        return next(b for b in self.buckets if b >= n)

    def ensure(self, b):
        pass

    def decode(self, n, inputs, ids=None):
        b = self.bucket(n)
        self.pad(inputs, n, b)
        return self.replay(b, ids)[:n].clone()

    def replay(self, b, ids=None):
        e = self.engine
        t = e._upload()
        if ids is not None:
            t[0, :len(ids)] = ids
        return e.model(t[0, :b], t[1, :b], t[2, :b], e.kv, DecodeContext(e.attention))


def cached_pages(cache):
    if hasattr(cache, "num_cached_pages"):
        return cache.num_cached_pages()
    return sum(len(n.pages) for n in cache._nodes())


class Probe:
    """One engine under random operations; check() after each."""

    def __init__(self, model, oracle, seed, attention="torch-ref", cache="cpp", page_size=4,
                 pool_tokens=None, max_batch=6, max_drafts=24, max_live=7, max_len=72,
                 check_kv=True, log=None):
        self.rng = rng = random.Random(seed)
        self.oracle, self.ps = oracle, page_size
        fp32 = model.model.embed_tokens.weight.dtype == torch.float32
        self.atol = FP32_ATOL if fp32 else FP16_ATOL
        self.kv_atol = FP32_KV_ATOL if fp32 else FP16_KV_ATOL
        pool_tokens = pool_tokens or rng.randrange(110, 320)
        num_pages = -(-pool_tokens // page_size) + 1
        self.engine = build_engine(model, attention, cache, page_size=page_size,
                                   num_pages=num_pages, max_batch=max_batch, max_drafts=max_drafts)
        # padded steps (GraphRunner's layout, run eagerly) and chunked prefill, some runs
        self.padded = rng.random() < 0.4
        if self.padded:
            self.engine.graphs = EagerGraphs(self.engine)
        self.engine.prefill_chunk = rng.choice([1024, 1024, 3, 7])
        self.vocab = model.cfg.vocab_size
        self.alphabet = [rng.randrange(self.vocab) for _ in range(3)]  # repeats: shared pages
        self.max_batch, self.max_drafts = max_batch, max_drafts
        self.max_live, self.max_len, self.check_kv = max_live, max_len, check_kv
        self.live, self.released, self.texts = [], [], []
        self.prepared, self.verified_since_prepare = None, False
        self.stats = Counter()
        self.log = log if log is not None else []
        self.err = 0.0
        self.cached = 0

    # -- helpers ------------------------------------------------------------------------
    def check_row(self, what, tokens, row):
        ref = self.oracle.logits(tokens)
        err = (row.float().cpu() - ref).abs().max().item()
        self.err = max(self.err, err)
        # |engine - ref| <= atol everywhere also bounds the argmax: the engine's greedy
        # token is within 2 * atol of the reference's best
        assert err <= self.atol, f"{what}: max |engine - reference| = {err} ({len(tokens)} tokens)"
        top = ref.topk(2).values
        if top[0] - top[1] > 2 * self.atol:
            assert int(row.argmax()) == int(ref.argmax()), f"{what}: argmax differs"

    def next_token(self, row):
        if self.rng.random() < 0.15:
            return self.rng.randrange(self.vocab)
        return int(row.argmax())

    def random_tokens(self, n):
        pick = self.alphabet if self.rng.random() < 0.5 else range(self.vocab)
        return [self.rng.choice(pick) for _ in range(n)]

    def make_prompt(self):
        rng, ps = self.rng, self.ps
        if self.released and rng.random() < 0.15:   # a released text again: a cache hit
            s = rng.choice(self.released)
            prompt = list(s.tokens if rng.random() < 0.5 else s.tokens[:s.kv_len])
            self.stats["add_released_text"] += 1
            return prompt[:self.max_len - 8] or [0]
        sources = self.texts + [s.tokens for s in self.live]
        prefix = []
        if sources and rng.random() < 0.8:
            src = rng.choice(sources)
            r = rng.random()
            if r < 0.6:     # at a page boundary, or one token either side of it
                n = rng.randrange(0, len(src) // ps + 1) * ps + rng.choice([-1, 0, 0, 1])
            else:
                n = rng.randrange(0, len(src) + 1)
            prefix = list(src[:max(0, min(n, len(src)))])
        suffix = self.random_tokens(rng.choice([0, 0, 1, 2, 3, 5, 9, 17]))
        prompt = (prefix + suffix)[:self.max_len - 8]
        return prompt or self.random_tokens(1 + rng.randrange(12))

    def state(self, seqs):
        return [(list(s.tokens), s.kv_len, s.cached_len, list(s.tail), s.node) for s in seqs]

    def pick(self, k_max=None):
        k_max = min(k_max or self.max_batch, len(self.live))
        return self.rng.sample(self.live, self.rng.randrange(1, k_max + 1))

    # -- operations -----------------------------------------------------------------------
    def op_add(self):
        prompt = self.make_prompt()
        self.log.append(f"add {prompt}")
        try:
            seq, logits = self.engine.add(prompt)
        except ValueError as e:
            assert "KV cache full" in str(e), e
            self.stats["add_full"] += 1
            return
        self.stats["add"] += 1
        self.stats["add_cached_tokens"] += seq.cached_len
        self.check_row("add", prompt, logits)
        seq.tokens.append(self.next_token(logits))
        self.live.append(seq)
        self.texts.append(list(prompt))

    def op_decode(self):
        rng = self.rng
        if self.prepared and rng.random() < 0.6 and all(s.node is not None for s in self.prepared):
            batch = list(self.prepared)
            self.stats["decode_prepared_batch"] += 1
            if self.verified_since_prepare:   # the plan prepare() made was replaced since
                self.stats["decode_prepared_after_verify"] += 1
        else:
            batch = self.pick()
        use_ids = rng.random() < 0.25
        self.log.append(f"decode {[self.live.index(s) for s in batch]} ids={use_ids}")
        before = self.state(batch)
        pending = [s.tokens[s.kv_len] for s in batch]
        try:
            if use_ids:
                for s in batch:
                    s.tokens.pop()
                logits = self.engine.decode(batch, ids=torch.tensor(pending, dtype=torch.long))
            else:
                logits = self.engine.decode(batch)
        except ValueError as e:
            assert "KV cache full" in str(e), e
            if use_ids:
                for s, t in zip(batch, pending):
                    s.tokens.append(t)
            after = self.state(batch)
            assert [a[:3] for a in after] == [b[:3] for b in before], "failed decode changed state"
            self.stats["decode_full"] += 1
            return
        finally:
            self.prepared = None
        if use_ids:
            for s, t in zip(batch, pending):
                s.tokens.append(t)
        self.stats["decode"] += 1
        self.stats["decoded_rows"] += len(batch)
        for s, row in zip(batch, logits):
            self.check_row("decode", s.tokens[:s.kv_len], row)
            s.tokens.append(self.next_token(row))

    def op_prepare(self):
        batch = self.pick()
        self.log.append(f"prepare {[self.live.index(s) for s in batch]}")
        ok = self.engine.prepare(batch)
        self.prepared = batch if ok else None
        self.verified_since_prepare = False
        self.stats["prepare" if ok else "prepare_false"] += 1

    def make_draft(self, seq, budget):
        rng = self.rng
        n = min(budget, rng.choice([0, 1, 2, 3, 4, 6, 8]))
        chain = []
        if n and rng.random() < 0.7:   # the reference's greedy continuation: accepted
            chain = self.oracle.greedy(seq.tokens, min(n, rng.randrange(1, 5)))
        others = n - len(chain)
        # chain nodes keep their order, the others go anywhere (parents first)
        kinds = ["c"] * len(chain) + ["o"] * others
        rng.shuffle(kinds)
        tokens, parents, last, ci = [], [], -1, 0
        for kind in kinds:
            if kind == "c":
                tokens.append(chain[ci])
                parents.append(last)
                last, ci = len(tokens) - 1, ci + 1
            else:
                p = rng.randrange(-1, len(tokens))
                parent_tokens = None
                if rng.random() < 0.3:   # a greedy token under a random node (maybe a duplicate)
                    path = []
                    q = p
                    while q >= 0:
                        path.append(tokens[q])
                        q = parents[q]
                    parent_tokens = seq.tokens + path[::-1]
                tokens.append(int(self.oracle.logits(parent_tokens).argmax()) if parent_tokens
                              else self.random_tokens(1)[0])
                parents.append(p)
        return Draft(tokens, parents)

    def op_verify(self):
        rng = self.rng
        others = [s for s in self.live if not any(s is p for p in self.prepared or ())]
        if self.prepared and rng.random() < 0.3 and all(s.node is not None for s in self.prepared):
            batch = list(self.prepared)
        elif self.prepared and others and rng.random() < 0.4:   # leaves the prepared lengths
            batch = rng.sample(others, rng.randrange(1, min(len(others), self.max_batch) + 1))
        else:
            batch = self.pick()
        budget, drafts = self.max_drafts, []
        for s in batch:
            drafts.append(self.make_draft(s, budget))
            budget -= len(drafts[-1])
        self.log.append(f"verify {[self.live.index(s) for s in batch]} "
                        f"{[(d.tokens, d.parents) for d in drafts]}")
        before = self.state(batch)
        try:
            out = verify(self.engine, batch, drafts, return_logits=True)
        except ValueError as e:
            assert "KV cache full" in str(e), e
            assert self.state(batch) == before, "failed verify changed state"
            self.stats["verify_full"] += 1
            return
        self.stats["verify"] += 1
        self.verified_since_prepare = True
        for s, b, d, logits, toks in zip(batch, before, drafts, out.logits, out.tokens):
            tokens = b[0]                          # ends with the pending token
            assert logits.shape[0] == 1 + len(d)
            self.check_row("verify pending", tokens, logits[0])
            paths = {-1: []}
            for j, (t, p) in enumerate(zip(d.tokens, d.parents)):
                paths[j] = paths[p] + [t]
                self.check_row(f"verify draft {j}", tokens + paths[j], logits[1 + j])
            # greedy acceptance on the returned logits
            child = {}
            for j, (t, p) in enumerate(zip(d.tokens, d.parents)):
                child.setdefault((p, t), j)
            node, choice, acc = -1, int(logits[0].argmax()), []
            while (node, choice) in child:
                node = child[(node, choice)]
                acc.append(d.tokens[node])
                choice = int(logits[1 + node].argmax())
            assert toks == acc + [choice], f"accepted {toks}, expected {acc + [choice]}"
            assert s.tokens == tokens + toks and s.kv_len == b[1] + len(toks)
            self.stats["accepted"] += len(toks) - 1
            if rng.random() < 0.15:               # another pending token than the bonus
                s.tokens[-1] = rng.randrange(self.vocab)

    def op_fork(self):
        s = self.rng.choice(self.live)
        n = self.rng.choice([1, 2, 2, 3])
        self.log.append(f"fork {self.live.index(s)} {n}")
        try:
            children = self.engine.fork(s, n)
        except ValueError as e:
            assert "KV cache full" in str(e), e
            assert s.node is not None
            self.stats["fork_full"] += 1
            return
        self.stats["fork"] += 1
        assert s.node is None
        self.live.remove(s)
        self.released.append(s)
        for c in children[1:]:
            if self.rng.random() < 0.5:     # the samples diverge at their pending token
                c.tokens[-1] = self.rng.randrange(self.vocab)
        self.live += children

    def op_release(self, s=None):
        s = s or self.rng.choice(self.live)
        publish = self.rng.random() < 0.6
        self.log.append(f"release {self.live.index(s)} publish={publish}")
        self.engine.release(s, publish=publish)
        self.live.remove(s)
        self.released.append(s)
        self.texts.append(list(s.tokens))
        self.stats["release"] += 1

    def op_publish(self):
        s = self.rng.choice(self.live)
        self.log.append(f"publish {self.live.index(s)}")
        self.engine.publish(s)
        self.stats["publish"] += 1

    def op_bad(self):
        """Refused calls change nothing: a released sequence, one sequence twice."""
        rng, e = self.rng, self.engine
        batch = self.pick(max(1, self.max_batch - 1))
        if self.released and rng.random() < 0.5:
            batch.insert(rng.randrange(len(batch) + 1), rng.choice(self.released))
        else:
            batch.insert(rng.randrange(len(batch) + 1), rng.choice(batch))
        self.log.append("bad")
        before, free = self.state(self.live), e.cache.num_free_pages()
        call = rng.choice(["decode", "verify", "prepare"])
        if call == "prepare":
            assert e.prepare(batch) is False
            self.prepared = None
        else:
            with pytest.raises(ValueError, match="released sequence|seqs\\[\\d+\\] is seqs"):
                if call == "decode":
                    e.decode(batch)
                else:
                    verify(e, batch, [Draft([1], [-1]) for _ in batch])
        assert self.state(self.live) == before and e.cache.num_free_pages() == free
        self.stats["bad"] += 1

    # -- invariants -----------------------------------------------------------------------
    def check(self):
        e, ps = self.engine, self.ps
        e.cache.check()
        tails = []
        for s in self.live:
            assert s.node is not None, "a live sequence without its node"
            assert s.cached_len % ps == 0 and s.cached_len <= s.kv_len, \
                f"cached_len {s.cached_len}, kv_len {s.kv_len}, pages of {ps}"
            assert len(s.tokens) == s.kv_len + 1
            assert len(s.tail) * ps >= s.kv_len - s.cached_len, "KV rows without a page"
            assert len(s.tail) <= -(-(s.kv_len + 1 - s.cached_len) // ps), "tail page leaked"
            assert len(s.cached_pages) * ps == s.cached_len
            tails += s.tail
        assert len(set(tails)) == len(tails), "a page in two tails"
        assert all(0 <= p < e.capacity for p in tails), "a tail holds the scratch page"
        if self.live:
            parents, ntok, offsets, pages, index = e.cache.export_tree([s.node for s in self.live])
            for s, i in zip(self.live, index.tolist()):
                path = []
                while i >= 0:
                    path.append(i)
                    i = parents[i]
                got = [p for i in path[::-1] for p in pages[offsets[i]:offsets[i + 1]]]
                assert got == s.cached_pages.tolist(), "cached_pages differ from the radix path"
            assert not set(tails) & set(pages.tolist()), "a tail page is also cached"
        free, cached = e.cache.num_free_pages(), cached_pages(e.cache)
        if cached < self.cached:   # only alloc's eviction drops cached pages
            self.stats["evicted_pages"] += self.cached - cached
        self.cached = cached
        assert free + cached + len(tails) == e.capacity, \
            f"pages: {free} free + {cached} cached + {len(tails)} in tails != {e.capacity}"
        if hasattr(e.cache, "_free"):
            assert not set(e.cache._free) & set(tails), "a tail page is free"
        if self.check_kv:
            for s in self.live:
                rows = torch.from_numpy(e.host_rows(s, 0, s.kv_len))
                k = e.kv.k.view(e.kv.k.shape[0], -1, *e.kv.k.shape[3:])[:, rows].float()
                v = e.kv.v.view(e.kv.v.shape[0], -1, *e.kv.v.shape[3:])[:, rows].float()
                rk, rv = self.oracle.kv(s.tokens[:s.kv_len])
                err = max((k - rk).abs().max().item(), (v - rv).abs().max().item())
                assert err <= self.kv_atol, f"K/V rows of a live sequence differ by {err}"

    # -- driver ---------------------------------------------------------------------------
    OPS = [("add", 18), ("decode", 28), ("prepare", 10), ("verify", 16), ("fork", 8),
           ("release", 9), ("publish", 4), ("bad", 3)]

    def step(self):
        rng = self.rng
        long = [s for s in self.live if s.kv_len >= self.max_len]
        if long:
            return self.op_release(rng.choice(long))
        if not self.live:
            return self.op_add()
        names, weights = zip(*self.OPS)
        name = rng.choices(names, weights)[0]
        if name == "add" and len(self.live) >= self.max_live:
            name = "release"
        if name == "fork" and len(self.live) >= self.max_live - 1:
            name = "decode"
        getattr(self, "op_" + name)()

    def run(self, num_ops):
        for _ in range(num_ops):
            self.step()
            self.check()
        for s in list(self.live):
            self.op_release(s)
            self.check()
        e = self.engine
        e.cache.evict(e.capacity)
        e.cache.check()
        assert e.cache.num_free_pages() == e.capacity, "pages lost"
        return self.stats


CONFIGS = [  # (attention, dtype, cache, page_size)
    (a, dt, c, ps) for a, dt in (("torch-ref", "fp32"), ("auto", "fp16"), ("per-query", "fp16"))
    for c in ("cpp", "py") for ps in (1, 2, 4, 16)]


def run_probe(hf, models, seed, num_ops, attention, dtype, cache, page_size, **kw):
    log = []
    probe = Probe(models[dtype], Oracle(hf), seed, attention, cache, page_size, log=log, **kw)
    try:
        return probe.run(num_ops), probe
    except BaseException:
        print(f"FAILED seed={seed} {attention} {dtype} {cache} ps={page_size} padded="
              f"{probe.padded} prefill_chunk={probe.engine.prefill_chunk}; last ops:",
              *log[-12:], sep="\n  ")
        raise


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = tiny_hf_model("llama3")
    folder = save(hf, tmp_path_factory.mktemp("llama3-random-ops"))
    return hf, {"fp32": load_model(folder, dtype="fp32"), "fp16": load_model(folder, dtype="fp16")}


# seeds picked to cover, between them: pages of 1, 2, 4 and 16 tokens, both caches, the
# torch-ref and treeattn (auto, per-query) attention, padded (bucketed) steps, chunked
# prefill, evictions, "KV cache full", forks, accepted drafts, prompts hitting the cache
# and a decode of a prepared batch after a verify of another batch
@pytest.mark.parametrize("seed, attention, dtype, cache, page_size", [
    (1, "torch-ref", "fp32", "cpp", 1),
    (2, "torch-ref", "fp32", "py", 2),     # padded steps, prefill chunks of 3
    (3, "torch-ref", "fp32", "cpp", 4),
    (4, "torch-ref", "fp32", "cpp", 16),   # padded steps, prefill chunks of 7
    (2, "auto", "fp16", "cpp", 4),         # padded steps, prefill chunks of 3
    (3, "per-query", "fp16", "py", 2),
])
def test_random_operations_match_reference(tiny, seed, attention, dtype, cache, page_size):
    hf, models = tiny
    stats, probe = run_probe(hf, models, seed, 100, attention, dtype, cache, page_size)
    for what in ("add", "add_cached_tokens", "decode", "prepare", "verify", "accepted", "fork",
                 "release", "evicted_pages"):
        assert stats[what] > 0, f"the run did no {what}: {dict(stats)}"


@pytest.mark.parametrize("attention, dtype", [("torch-ref", "fp32"), ("auto", "fp16")])
@pytest.mark.parametrize("drafts", [0, 2])
def test_verify_drops_the_plan_prepared_ahead(tiny, attention, dtype, drafts):
    """prepare(A), then verify(B) (its own plan_tree_queries), then decode(A): decode must
    plan again, not run A's tokens on B's plan (found by the probe above: B's plan with as
    many queries as A's gave wrong logits silently, with more it raised)."""
    hf, models = tiny
    oracle = Oracle(hf)
    e = build_engine(models[dtype], attention, "cpp", page_size=4, num_pages=64, max_batch=4,
                     max_drafts=8)
    a, logits_a = e.add([1, 2, 3, 4, 5])
    a.tokens.append(int(logits_a.argmax()))
    b, logits_b = e.add([9, 8, 7])
    b.tokens.append(int(logits_b.argmax()))
    assert e.prepare([a])
    verify(e, [b], [Draft([5, 6][:drafts], [-1, 0][:drafts])])
    logits = e.decode([a])
    err = (logits[0].float() - oracle.logits(a.tokens[:a.kv_len])).abs().max().item()
    assert err <= (FP32_ATOL if dtype == "fp32" else FP16_ATOL)



def test_a_prepared_plan_is_dropped_through_one_method(tiny, monkeypatch):
    """Engine.drop_prepared() is the one statement of when a plan prepare() made is stale:
    after it, decode() of the prepared batch plans again (without it, it plans nothing);
    verify() (its own plan_tree_queries) and GraphRunner.capture() of every launch (a plan
    of padding queries) replace the backend's plan through it. capture() runs here up to
    its first CUDA call, which the test stops."""
    hf, models = tiny
    oracle = Oracle(hf)
    e = build_engine(models["fp32"], "torch-ref", "cpp", page_size=4, num_pages=64, max_batch=4,
                     max_drafts=8)
    plans, plan_tree = [], e.attention.plan_tree
    monkeypatch.setattr(e.attention, "plan_tree", lambda *a, **kw: (plans.append(1), plan_tree(*a, **kw))[1])
    a, logits = e.add([1, 2, 3, 4, 5])
    for dropped in (True, False):
        a.tokens.append(int(logits.argmax()))
        before = len(plans)
        assert e.prepare([a]) and len(plans) == before + 1
        if dropped:
            e.drop_prepared()
        logits = e.decode([a])[0]
        assert len(plans) == before + 1 + dropped, dropped
        assert (logits - oracle.logits(a.tokens[:a.kv_len])).abs().max().item() <= FP32_ATOL

    b, logits_b = e.add([9, 8, 7])
    b.tokens.append(int(logits_b.argmax()))
    a.tokens.append(int(logits.argmax()))
    calls, drop = [], type(e).drop_prepared
    monkeypatch.setattr(type(e), "drop_prepared", lambda self: (calls.append(self), drop(self))[1])
    assert e.prepare([a])
    verify(e, [b], [Draft([5], [-1])])
    assert calls == [e] and not e._prepared([a])

    class NoCuda(Exception):
        pass

    def stream():
        raise NoCuda
    runner = GraphRunner.__new__(GraphRunner)   # __init__ needs a CUDA device
    runner.engine, runner.scratch_row, runner.every_launch = e, e.scratch_page * e.page_size, 0
    runner.inputs = torch.zeros((3, 4), dtype=torch.long)
    runner.ids, runner.positions, runner.slots = runner.inputs
    monkeypatch.setattr(torch.cuda, "Stream", stream)
    assert e.prepare([a])
    with pytest.raises(NoCuda):
        runner.capture(2)
    assert calls == [e, e] and not e._prepared([a])

if __name__ == "__main__":
    import tempfile
    torch.set_num_threads(1)
    seeds, num_ops = int(sys.argv[1]), int(sys.argv[2])
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    only = sys.argv[4] if len(sys.argv) > 4 else None
    hf = tiny_hf_model("llama3")
    folder = save(hf, tempfile.mkdtemp())
    models = {"fp32": load_model(folder, dtype="fp32"), "fp16": load_model(folder, dtype="fp16")}
    total = Counter()
    for seed in range(first, first + seeds):
        cfg = CONFIGS[seed % len(CONFIGS)]
        if only and only not in " ".join(map(str, cfg)):
            continue
        t = time.time()
        stats, probe = run_probe(hf, models, seed, num_ops, *cfg)
        total += stats
        print(f"seed {seed} {cfg} padded={probe.padded} chunk={probe.engine.prefill_chunk}: "
              f"{time.time() - t:.1f}s max err {probe.err:.2e} {dict(stats)}", flush=True)
    print("total", dict(total))
