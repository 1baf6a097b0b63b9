"""A randomized, stateful differential probe of ONE long-lived treeattn.TreeAttention
(CPU executor): a long random walk of plan_tree / plan_block_tables /
plan_tree_queries steps (decode growth, forks, finishes with page reuse, reorders,
second roots, rollbacks, remapped page ids, near-capacity then tiny trees, invalid
inputs that must be refused and leave the object usable), each followed by runs
(fresh tensors, out=, lse=, strided pools, bound runs across plans) checked
against an fp64 NumPy reference computed from the same arrays.

Every pool row the plan in force does not reference is poisoned (K = +-2,
V = +-POISON) before the runs, so a plan that reads a stale page (a freed one, a
page of an old tree, a slot past a node's end) is off by ~POISON / context, far
beyond the tolerance; the lse (fp32) catches a missing or doubled token down to a
weight of ~1e-5.

Used by tests/python/test_runtime_random_states.py; as a script it soaks:

    .venv/bin/python tests/python/runtime_random_states.py --minutes 20 --steps 400
"""

from __future__ import annotations

import argparse
import collections
import math
import time

import numpy as np
import torch

import treeattn

BIG_EXT = 1 << 30  # max_extension_tokens that no unit reaches: every pure growth must extend
POISON = 256.0
# Tolerances. Inputs are exact fp16/bf16 values and the reference is fp64 over
# those same values, so the only differences are the executor's fp32 arithmetic
# (scores, exp, running sums: relative ~1e-6) and the rounding of the output to
# the dtype (half an ulp: 2^-11 relative for fp16, 2^-8... 2^-9 for bf16) plus, if
# the executor rounds probabilities or partial sums to the dtype before P.V or a
# merge, at most one more ulp of max|V| = 1. So |out - ref| <= u * (|ref| + 1)
# with u = 2^-10 (fp16) / 2^-7 (bf16) is ~2 ulps of slack. lse is fp32 over
# exact inputs: 2e-4 absolute (scores are O(10), fp32 epsilon 1.2e-7, D = 64
# terms; measured below 1e-5). A missing or doubled token of weight p moves the
# lse by ~p and out by p * |v - out|; a poisoned row moves out by ~POISON * p.
UNIT = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
LSE_ATOL = 2e-4
TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Refused(Exception):
    """A plan the probe expected to succeed raised (or the other way round)."""


def cdiv(a, b):
    return -(-a // b)


# ---- the reference ----------------------------------------------------------------------------------------------

def tree_rows(parents, num_tokens, page_offsets, page_ids, first_slots, node, ps):
    """Pool rows of the path root..node, straight from plan_tree's arrays."""
    rows = []
    seen = 0
    while node >= 0:
        seen += 1
        assert seen <= len(parents), "cycle in a tree the runtime accepted"
        fs = 0 if first_slots is None else int(first_slots[node])
        pages = page_ids[page_offsets[node]:page_offsets[node + 1]]
        rows += [int(pages[(fs + t) // ps]) * ps + (fs + t) % ps for t in range(int(num_tokens[node]))]
        node = int(parents[node])
    return rows


def reference(q, k_rows, v_rows, rows_per_query, scale):
    """fp64 attention of query i over k_rows/v_rows[rows_per_query[i]] (GQA); (out, lse), lse -inf and out 0 for
    an empty context."""
    Q, H, D = q.shape
    Hkv = k_rows.shape[1]
    g = H // Hkv
    out = np.zeros((Q, H, D))
    lse = np.full((Q, H), -np.inf)
    for i, rows in enumerate(rows_per_query):
        if not rows:
            continue
        idx = np.asarray(rows)
        kk = np.repeat(k_rows[idx], g, axis=1)  # [T, H, D]
        vv = np.repeat(v_rows[idx], g, axis=1)
        s = np.einsum("hd,thd->ht", q[i], kk) * scale
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        den = p.sum(axis=1)
        out[i] = np.einsum("ht,thd->hd", p, vv) / den[:, None]
        lse[i] = m[:, 0] + np.log(den)
    return out, lse


# ---- the explicit tree the engine keeps -------------------------------------------------------------------------

class Pool:
    """Page ids handed out and freed (LIFO: a freed page is the next one handed out)."""

    def __init__(self, rng, num_pages):
        self.free = [int(p) for p in rng.permutation(num_pages)]
        self.reused = 0
        self.freed_set = set()

    def alloc(self):
        p = self.free.pop()
        if p in self.freed_set:
            self.reused += 1
            self.freed_set.discard(p)
        return p

    def release(self, pages):
        for p in pages:
            self.free.append(int(p))
            self.freed_set.add(int(p))


class Tree:
    """nodes: [parent, tokens, first_slot, pages]; a child may start inside its parent's partial last page
    (first_slot > 0, that page its first): then the page is the parent's."""

    def __init__(self, ps):
        self.ps = ps
        self.nodes = []
        self.queries = []

    def copy(self):
        t = Tree(self.ps)
        t.nodes = [[a, b, c, list(d)] for a, b, c, d in self.nodes]
        t.queries = list(self.queries)
        return t

    def children(self, v):
        return [c for c, n in enumerate(self.nodes) if n[0] == v]

    def childless(self):
        has = {n[0] for n in self.nodes}
        return [v for v in range(len(self.nodes)) if v not in has]

    def end_slot(self, v):
        return self.nodes[v][2] + self.nodes[v][1]

    def own_pages(self, v):
        n = self.nodes[v]
        return n[3][1:] if n[2] > 0 and n[3] else list(n[3])

    def tail_taken(self, v):
        """A child already starts inside v's last page."""
        n = self.nodes[v]
        return bool(n[3]) and any(c[2] > 0 and c[3] and c[3][0] == n[3][-1] for c in self.nodes if c[0] == v)

    def page_refs(self):
        return sum(len(n[3]) for n in self.nodes)

    def shares_pages(self):
        pages = [p for n in self.nodes for p in n[3]]
        return len(pages) != len(set(pages))

    def arrays(self, first_slots_mode="auto"):
        parents = [n[0] for n in self.nodes]
        tokens = [n[1] for n in self.nodes]
        offsets = [0]
        ids = []
        for n in self.nodes:
            ids += n[3]
            offsets.append(len(ids))
        fs = [n[2] for n in self.nodes]
        if first_slots_mode == "auto":
            first_slots = fs if any(fs) else None
        elif first_slots_mode == "always":
            first_slots = fs
        else:
            first_slots = None
        return dict(parents=parents, num_tokens=tokens, page_offsets=offsets, page_ids=ids,
                    query_nodes=list(self.queries), first_slots=first_slots)

    def check(self):
        ps = self.ps
        for v, (par, t, fs, pages) in enumerate(self.nodes):
            assert -1 <= par < len(self.nodes)
            assert len(pages) == (0 if t == 0 else cdiv(fs + t, ps)), (v, self.nodes[v])
        assert self.queries and all(0 <= q < len(self.nodes) for q in self.queries)

    def remove(self, v):
        """Drops childless node v (renumbering the ones after it); queries on it move to its parent or go."""
        par = self.nodes[v][0]
        del self.nodes[v]
        for n in self.nodes:
            if n[0] > v:
                n[0] -= 1
        qs = []
        for q in self.queries:
            if q == v:
                if par >= 0:
                    qs.append(par - (par > v))
            else:
                qs.append(q - (q > v))
        self.queries = qs

    def permute(self, perm):
        """Node v becomes node perm[v]."""
        new = [None] * len(self.nodes)
        for v, n in enumerate(self.nodes):
            new[perm[v]] = [perm[n[0]] if n[0] >= 0 else -1, n[1], n[2], n[3]]
        self.nodes = new
        self.queries = [perm[q] for q in self.queries]


# ---- the probe --------------------------------------------------------------------------------------------------

def random_config(rng):
    ps = int(rng.choice([1, 3, 16]))
    H, Hkv = [(4, 1), (8, 2), (2, 2)][int(rng.integers(3))]
    names = [n for n, _ in treeattn.planners()]
    return dict(ps=ps, H=H, Hkv=Hkv, dtype=str(rng.choice(["fp16", "bf16"])), planner=str(rng.choice(names)),
                max_ext=int(rng.choice([0, 1, 8, 64, BIG_EXT])), cpu_threads=int(rng.choice([1, 1, 1, 2])),
                max_queries=int(rng.integers(6, 33)), max_nodes=int(rng.integers(12, 60)))


class Probe:
    D = 64

    def __init__(self, seed, config=None, log=None):
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        c = dict(random_config(self.rng), **(config or {}))
        self.cfg = c
        self.log = log
        ps = self.ps = c["ps"]
        self.H, self.Hkv, self.dtype = c["H"], c["Hkv"], c["dtype"]
        self.tdtype = TORCH_DTYPE[self.dtype]
        self.num_pages = {1: 500, 3: 220, 16: 64}[ps]
        self.max_page_refs = c.get("max_page_refs", {1: 300, 3: 140, 16: 48}[ps])
        self.max_tokens = {1: 10, 3: 16, 16: 40}[ps]  # per node, as made by the probe
        self.attn = treeattn.TreeAttention(
            self.H, self.Hkv, self.D, ps, self.num_pages, dtype=self.dtype, device="cpu", planner=c["planner"],
            max_queries=c["max_queries"], max_nodes=c["max_nodes"], max_page_refs=self.max_page_refs,
            max_extension_tokens=c["max_ext"], cpu_threads=c["cpu_threads"])
        self.scale = 1.0 / math.sqrt(self.D)
        rows = self.num_pages * ps
        # K/V each page holds (a page handed out again gets new values), and the pools the runs read:
        # the rows the plan in force references hold these, every other row the poison.
        self.master_k = torch.zeros(rows, self.Hkv, self.D, dtype=self.tdtype)
        self.master_v = torch.zeros(rows, self.Hkv, self.D, dtype=self.tdtype)
        self._fill_rows(np.arange(rows))
        self.k = torch.empty(self.num_pages, ps, self.Hkv, self.D, dtype=self.tdtype)
        self.v = torch.empty_like(self.k)
        self.pool = Pool(self.rng, self.num_pages)
        self.bt_pool = Pool(self.rng, self.num_pages)  # block tables: their own allocator over the same pool
        self.tree = None
        self.force_is_tree = False
        self.bt = None  # [[pages, len]] of the block-table batch
        self.force = None  # the plan in force: rows per query, used-row mask, kind, ...
        self.bound = {}  # num_queries -> (BoundRun, q, out, lse)
        self._bufs = {}
        self.counts = collections.Counter()
        self.worst = collections.defaultdict(float)
        self.step_no = 0
        self.history = []

    # -- pools --------------------------------------------------------------------------------------------------
    def _fill_rows(self, rows):
        n = len(rows)
        if n == 0:
            return
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        self.master_k[idx] = torch.from_numpy(self.rng.uniform(-1, 1, (n, self.Hkv, self.D))).to(self.tdtype)
        self.master_v[idx] = torch.from_numpy(self.rng.uniform(-1, 1, (n, self.Hkv, self.D))).to(self.tdtype)

    def _fresh_pages(self, pages):
        ps = self.ps
        self._fill_rows([p * ps + s for p in pages for s in range(ps)])

    def _set_pools(self, used):
        """k/v <- master on the used rows (bool mask), poison elsewhere; in place (bound runs hold them)."""
        mask = torch.from_numpy(used)
        kf = self.master_k.clone()
        vf = self.master_v.clone()
        # Poisoned K rows: +-2 in every dimension (by row parity), so that a stale row scores high against
        # about half of the query heads whatever their scale; V rows +-POISON.
        par = torch.ones(len(mask), 1, 1, dtype=self.tdtype)
        par[1::2] = -1
        kf = torch.where(mask[:, None, None], kf, par * 2)
        sign = torch.ones(self.D, dtype=self.tdtype)
        sign[1::2] = -1
        vf[~mask] = (sign * POISON).to(self.tdtype)
        self.k.copy_(kf.view_as(self.k))
        self.v.copy_(vf.view_as(self.v))
        self.k64 = kf.double().numpy()
        self.v64 = vf.double().numpy()

    # -- planning -----------------------------------------------------------------------------------------------
    def _stats(self):
        return dict(self.attn.plan_stats())

    def _plan(self, kind, call, rows, used, expect, bits_valid_after, nodes):
        """Calls call() (a plan_*), expecting it to succeed, then checks plan_stats' move as documented and makes
        the plan in force `rows`. expect: 'extend' (must extend), 'fresh' (must plan afresh) or None."""
        before = self._stats()
        prev_bits = self.force["bits_valid"] if self.force else False
        try:
            call()
        except (ValueError, TypeError) as e:
            raise Refused(f"step {self.step_no} ({kind}): a valid plan raised {type(e).__name__}: {e}") from e
        after = self._stats()
        d = {k: after[k] - before[k] for k in after}
        assert d["planned"] + d["extended"] == 1, (kind, d)
        if self.cfg["max_ext"] == 0:
            assert d["extended"] == 0, (kind, d)
        if expect == "fresh":
            assert d["planned"] == 1, (f"step {self.step_no} {kind}: a changed tree was extended", d)
        elif expect == "extend" and prev_bits and self.cfg["max_ext"] == BIG_EXT:
            assert d["extended"] == 1, (f"step {self.step_no} {kind}: a pure growth was planned afresh", d)
        if d["planned"]:
            # Fresh plans check only the changed pages when the last tree's page bits are valid (no page shared
            # by two nodes) and the new tree shares none either.
            want = int(prev_bits and bits_valid_after)
            assert d["pages_rechecked"] == want, (f"step {self.step_no} {kind}: pages_rechecked", d, prev_bits,
                                                  bits_valid_after)
            self.counts["fresh"] += 1
        else:
            assert d["pages_rechecked"] == 0, d
            self.counts["extended"] += 1
        self.counts[kind] += 1
        nq = len(rows)
        assert self.attn.num_queries == nq
        s = self.attn.plan_summary()
        assert s["queries"] == nq, s
        # The plan in force's tree: its nodes, and every token once (each referenced row is one token).
        assert s["nodes"] == nodes, (f"step {self.step_no} {kind}: plan_summary nodes", s, nodes)
        assert s["unique_kv_bytes"] == int(used.sum()) * self.Hkv * self.D * 2 * 2, (
            f"step {self.step_no} {kind}: plan_summary unique_kv_bytes", s, int(used.sum()))
        self.force = dict(kind=kind, rows=rows, used=used, nq=nq, bits_valid=bits_valid_after)
        self._set_pools(used)

    def _expect_refused(self, kind, call):
        """call() must raise ValueError/TypeError and change nothing: the plan in force still runs correctly."""
        before = self._stats()
        nq = self.attn.num_queries
        try:
            call()
        except (ValueError, TypeError):
            pass
        else:
            raise Refused(f"step {self.step_no} ({kind}): an invalid plan was accepted")
        assert self._stats() == before, (kind, before, self._stats())
        assert self.attn.num_queries == nq
        self.counts["refused"] += 1
        self.counts["refused:" + kind] += 1
        if self.force is not None:
            self.run_and_check(tag=f"after refused {kind}")

    def _used_rows(self, rows_lists, extra=()):
        used = np.zeros(self.num_pages * self.ps, dtype=bool)
        for r in rows_lists:
            used[np.asarray(r, dtype=np.int64)] = True
        if len(extra):
            used[np.asarray(list(extra), dtype=np.int64)] = True
        return used

    def _tree_rows(self, a):
        fs = a["first_slots"]
        per_node = [tree_rows(a["parents"], a["num_tokens"], a["page_offsets"], a["page_ids"], fs, v, self.ps)
                    for v in range(len(a["parents"]))]
        return per_node

    def plan_tree(self, kind, tree, expect):
        tree.check()
        a = tree.arrays(first_slots_mode=str(self.rng.choice(["auto", "auto", "always"])))
        per_node = self._tree_rows(a)
        rows = [per_node[q] for q in a["query_nodes"]]
        used = self._used_rows(per_node)
        args = self._as_inputs(a)
        self._plan(kind, lambda: self.attn.plan_tree(**args), rows, used, expect, not tree.shares_pages(),
                   len(tree.nodes))
        self.tree = tree
        self.bt_state_in_force = None
        self.force_is_tree = True

    def _as_inputs(self, a):
        """The arrays as lists, int32 NumPy, int64 NumPy, CPU tensors, or int32 views of buffers the caller keeps
        and overwrites for the next call (the runtime must not keep pointers into them)."""
        form = int(self.rng.integers(5))
        out = {}
        for k, x in a.items():
            if x is None:
                out[k] = None
            elif form == 4:
                buf = self._bufs.setdefault(k, np.zeros(1 << 13, dtype=np.int32))
                buf[:] = -7  # stale junk past the end, and where the last call's values were
                buf[:len(x)] = x
                out[k] = buf[:len(x)]
            elif form == 0:
                out[k] = list(x)
            elif form == 1:
                out[k] = np.asarray(x, dtype=np.int32)
            elif form == 2:
                out[k] = np.asarray(x, dtype=np.int64)
            else:
                out[k] = torch.tensor(list(x), dtype=torch.int32)
        return out

    # -- runs ---------------------------------------------------------------------------------------------------
    def _q(self, nq):
        amp = float(self.rng.choice([1.0, 3.0, 8.0]))  # 8: peaky softmax, a few tokens carry the weight
        return torch.from_numpy(self.rng.uniform(-amp, amp, (nq, self.H, self.D))).to(self.tdtype)

    def _check(self, tag, q, out, lse, rows):
        q64 = q.double().numpy()
        ref, ref_lse = reference(q64, self.k64.reshape(-1, self.Hkv, self.D), self.v64.reshape(-1, self.Hkv, self.D),
                                 rows, self.scale)
        o = torch.as_tensor(np.asarray(out) if not isinstance(out, torch.Tensor) else out).double().numpy()
        u = UNIT[self.dtype]
        err = np.abs(o - ref)
        bound = u * (np.abs(ref) + 1.0)
        ratio = float((err / bound).max())
        self.worst["out_err/bound"] = max(self.worst["out_err/bound"], ratio)
        if not ratio <= 1.0:
            i, h, d = np.unravel_index(np.argmax(err / bound), err.shape)
            raise AssertionError(f"seed {self.seed} step {self.step_no} {tag} ({self.force['kind']}): out[{i},{h},{d}]"
                                 f" = {o[i, h, d]} vs reference {ref[i, h, d]} (err {err[i, h, d]:.3g}, bound "
                                 f"{bound[i, h, d]:.3g}); query {i} has {len(rows[i])} rows; cfg {self.cfg}")
        if lse is not None:
            l = torch.as_tensor(np.asarray(lse) if not isinstance(lse, torch.Tensor) else lse).double().numpy()
            empty = ~np.isfinite(ref_lse)
            assert np.all(np.isneginf(l[empty])), (tag, "lse of an empty context is not -inf")
            if (~empty).any():
                e = float(np.abs(l[~empty] - ref_lse[~empty]).max())
                self.worst["lse_err"] = max(self.worst["lse_err"], e)
                if not e <= LSE_ATOL:
                    raise AssertionError(f"seed {self.seed} step {self.step_no} {tag} ({self.force['kind']}): lse "
                                         f"off by {e:.3g}; cfg {self.cfg}")

    def run_and_check(self, tag="run"):
        f = self.force
        nq, rows = f["nq"], f["rows"]
        mode = str(self.rng.choice(["plain", "lse", "out", "out_lse", "bound", "bound", "strided", "numpy"]))
        q = self._q(nq)
        out = lse = None
        if mode == "numpy" and self.dtype != "fp16":
            mode = "plain"
        if mode == "plain":
            out = self.attn.run(q, self.k, self.v)
        elif mode == "lse":
            out, lse = self.attn.run(q.clone(), self.k.clone(), self.v.clone(), return_lse=True)
        elif mode in ("out", "out_lse"):
            out = torch.full_like(q, float("nan"))
            if mode == "out_lse":
                lse = torch.full((nq, self.H), float("nan"), dtype=torch.float32)
                got = self.attn.run(q, self.k, self.v, out=out, lse=lse)
                assert got[0] is out and got[1] is lse
            else:
                assert self.attn.run(q, self.k, self.v, out) is out
        elif mode == "strided":  # K/V interleaved per page, q a slice of a fused QKV
            kv = torch.empty(self.num_pages, 2, self.ps, self.Hkv, self.D, dtype=self.tdtype)
            kv[:, 0] = self.k
            kv[:, 1] = self.v
            qkv = torch.empty(nq, 3, self.H, self.D, dtype=self.tdtype)
            qkv[:, 1] = q
            out, lse = self.attn.run(qkv[:, 1], kv[:, 0], kv[:, 1], return_lse=True)
        elif mode == "numpy":
            out, lse = self.attn.run(q.numpy(), self.k.numpy(), self.v.numpy(), return_lse=True)
        elif mode == "bound":
            b = self.bound.get(nq)
            if b is None or self.rng.random() < 0.1:
                qb = torch.empty(nq, self.H, self.D, dtype=self.tdtype)
                ob = torch.empty_like(qb)
                lb = torch.empty(nq, self.H, dtype=torch.float32) if self.rng.random() < 0.5 else None
                b = (self.attn.bind(qb, self.k, self.v, ob, lse=lb), qb, ob, lb)
                self.bound[nq] = b
                self.counts["bind"] += 1
            else:
                self.counts["bound_reused"] += 1
            run, qb, ob, lb = b
            qb.copy_(q)
            ob.fill_(float("nan"))
            if lb is not None:
                lb.fill_(float("nan"))
            assert run() is ob
            out, lse = ob, lb
            self.counts["bound_run"] += 1
        self.counts["run:" + mode] += 1
        self._check(f"{tag}/{mode}", q, out, lse, rows)
        # A bound run of another query count must be refused (and change nothing).
        others = [n for n in self.bound if n != nq]
        if others and self.rng.random() < 0.3:
            run, qb, ob, lb = self.bound[int(self.rng.choice(others))]
            try:
                run()
            except ValueError:
                self.counts["bound_refused"] += 1
            else:
                raise AssertionError(f"step {self.step_no}: a bound run of {qb.shape[0]} queries ran a plan of {nq}")

    # -- tree steps ---------------------------------------------------------------------------------------------
    def _new_node(self, t, parent, tokens, share_tail):
        """Appends a node; share_tail: start inside the parent's partial last page (if it has a free tail)."""
        ps = self.ps
        fs = 0
        pages = []
        if share_tail and parent >= 0 and tokens > 0:
            pn = t.nodes[parent]
            e = t.end_slot(parent)
            if pn[3] and e % ps and not t.tail_taken(parent):
                fs = e % ps
                pages = [pn[3][-1]]
        need = 0 if tokens == 0 else cdiv(fs + tokens, ps)
        new = [self.pool.alloc() for _ in range(need - len(pages))]
        self._fresh_pages(new)
        t.nodes.append([parent, tokens, fs, pages + new])
        return len(t.nodes) - 1

    def _room(self, t, nodes=1, pages=0):
        c = self.cfg
        return (len(t.nodes) + nodes <= c["max_nodes"] and t.page_refs() + pages <= self.max_page_refs
                and len(self.pool.free) >= pages + 2)

    def _tokens(self):
        r = self.rng.random()
        if r < 0.1:
            return 0
        return int(self.rng.integers(1, self.max_tokens + 1))

    def _pages_for(self, tokens):
        return cdiv(tokens, self.ps) + 1

    def new_tree(self, nodes=None, queries=None):
        """A random forest (frees the old tree's pages)."""
        if self.tree is not None:
            self._free_tree(self.tree)
        t = Tree(self.ps)
        nodes = nodes or int(self.rng.integers(1, min(8, self.cfg["max_nodes"]) + 1))
        for v in range(nodes):
            tok = self._tokens() if v else max(1, self._tokens())
            if not self._room(t, 1, self._pages_for(tok)):
                break
            par = -1 if v == 0 or self.rng.random() < 0.1 else int(self.rng.integers(0, len(t.nodes)))
            self._new_node(t, par, tok, self.rng.random() < 0.3)
        nq = queries or int(self.rng.integers(1, self.cfg["max_queries"] + 1))
        leaves = t.childless()
        t.queries = [int(self.rng.choice(leaves)) if self.rng.random() < 0.8 else int(self.rng.integers(len(t.nodes)))
                     for _ in range(nq)]
        return t

    def _free_tree(self, t):
        for v in range(len(t.nodes)):
            self.pool.release(t.own_pages(v))

    def step_grow(self):
        """A decode step: query nodes (sometimes other childless ones) get tokens: one, exactly the rest of the
        page, or several pages' worth."""
        t = self.tree.copy()
        ps = self.ps
        growable = [v for v in t.childless() if t.nodes[v][1] > 0]
        if not growable:
            return self.step_change()
        qn = [v for v in set(t.queries) if v in growable]
        pick = qn if qn and self.rng.random() < 0.7 else [v for v in growable if self.rng.random() < 0.5]
        reused0 = self.pool.reused
        new_pages_total = 0
        for v in pick:
            e = t.end_slot(v)
            r = self.rng.random()
            if r < 0.5:
                g = 1
            elif r < 0.75:
                g = ps - e % ps if e % ps else ps  # exactly fill the page (or one whole new page)
            else:
                g = int(self.rng.integers(1, 3 * ps + 2))  # crossing several pages
            n = t.nodes[v]
            need = cdiv(n[2] + n[1] + g, ps) - len(n[3])
            if not self._room(t, 0, need):
                continue
            new = [self.pool.alloc() for _ in range(need)]
            self._fresh_pages(new)
            n[1] += g
            n[3] += new
            new_pages_total += need
        if self.rng.random() < 0.08 and pick:
            # An invalid growth first: one appended page is another node's (must be refused, and the next valid
            # growth must still extend).
            self._invalid_growth(t, pick)
        self.counts["grow_pages"] += new_pages_total
        ext = self.counts["extended"]
        self.plan_tree("grow", t, "extend" if self.force_is_tree else None)
        if self.counts["extended"] > ext and self.pool.reused > reused0:
            self.counts["reused_page_in_extension"] += 1

    def _invalid_growth(self, t, pick):
        ps = self.ps
        grown = [v for v in pick if len(t.nodes[v][3]) > len(self.tree.nodes[v][3])]
        others = [v for v in range(len(t.nodes)) if t.nodes[v][3] and v not in grown]
        if not grown or not others:
            return
        bad = t.copy()
        v = int(self.rng.choice(grown))
        o = int(self.rng.choice(others))
        # A page node o uses from slot 0 (its pages but a shared first one): the appended page, used from slot 0,
        # overlaps it.
        cand = t.own_pages(o)
        if not cand:
            return
        j = len(self.tree.nodes[v][3]) + int(self.rng.integers(len(bad.nodes[v][3]) - len(self.tree.nodes[v][3])))
        bad.nodes[v][3][j] = int(self.rng.choice(cand))
        a = self._as_inputs(bad.arrays())
        self._expect_refused("growth_page_taken", lambda: self.attn.plan_tree(**a))

    def step_same(self):
        self.plan_tree("same", self.tree.copy(), "extend" if self.force_is_tree else None)

    def step_change(self):
        """One to three structural changes; then a fresh plan."""
        t = self.tree.copy()
        ops = [self._fork, self._finish, self._finish, self._reorder, self._second_root, self._requery,
               self._rollback]
        did = []
        for _ in range(int(self.rng.integers(1, 4))):
            op = ops[int(self.rng.integers(len(ops)))]
            if op(t):
                did.append(op.__name__.strip("_"))
        if not did:
            return self.step_same()
        for d in did:
            self.counts["op:" + d] += 1
        # A structural change is planned afresh (requery/reorder may recreate the old tree: then anything goes).
        changed = self._differs(t) and self.force_is_tree
        self.plan_tree("change", t, "fresh" if changed else None)

    def _differs(self, t):
        a, b = t.arrays("always"), self.tree.arrays("always")
        if a["query_nodes"] != b["query_nodes"] or a["parents"] != b["parents"] or a["first_slots"] != b["first_slots"]:
            return True
        for v in range(len(a["parents"])):
            old, new = self.tree.nodes[v], t.nodes[v]
            if new[3][:len(old[3])] != old[3] or new[1] < old[1]:
                return True
            if new[1] > old[1] and (old[1] == 0 or self.tree.children(v)):
                return True
        return False

    def _fork(self, t):
        v = int(self.rng.integers(len(t.nodes)))
        k = int(self.rng.integers(1, 4))
        made = 0
        for _ in range(k):
            tok = self._tokens()
            if not self._room(t, 1, self._pages_for(tok)):
                break
            c = self._new_node(t, v, tok, self.rng.random() < 0.5)
            made += 1
            if self.rng.random() < 0.6 and len(t.queries) < self.cfg["max_queries"]:
                t.queries.append(c)
        if made and self.rng.random() < 0.5:  # the forked node's queries move to its (first new) child
            c = len(t.nodes) - made
            t.queries = [c if q == v else q for q in t.queries]
        return made > 0

    def _finish(self, t):
        """A branch finishes: a childless node goes, its pages are freed (and handed out next)."""
        leaves = [v for v in t.childless() if len(t.nodes) > 1]
        if not leaves:
            return False
        v = int(self.rng.choice(leaves))
        if all(q == v for q in t.queries) and t.nodes[v][0] < 0:
            return False
        self.pool.release(t.own_pages(v))
        t.remove(v)
        if not t.queries:
            t.queries = [int(self.rng.integers(len(t.nodes)))]
        return True

    def _reorder(self, t):
        if len(t.nodes) < 2:
            return False
        t.permute([int(x) for x in self.rng.permutation(len(t.nodes))])
        return True

    def _second_root(self, t):
        tok = self._tokens()
        if not self._room(t, 1, self._pages_for(tok)):
            return False
        r = self._new_node(t, -1, tok, False)
        if len(t.queries) < self.cfg["max_queries"]:
            t.queries.append(r)
        return True

    def _requery(self, t):
        nq = int(self.rng.integers(1, self.cfg["max_queries"] + 1))
        t.queries = [int(self.rng.integers(len(t.nodes))) for _ in range(nq)]
        return True

    def _rollback(self, t):
        """A childless node loses tokens (rejected speculative tokens); the pages past its new end are freed."""
        cand = [v for v in t.childless() if t.nodes[v][1] > 0]
        if not cand:
            return False
        v = int(self.rng.choice(cand))
        n = t.nodes[v]
        n[1] = int(self.rng.integers(0, n[1]))
        keep = 0 if n[1] == 0 else cdiv(n[2] + n[1], self.ps)
        own_from = 1 if n[2] > 0 and n[3] else 0
        self.pool.release(n[3][max(keep, own_from):])
        n[3] = n[3][:keep]
        return True

    def step_remap(self):
        """The same shape, other page ids (a permutation of the pool)."""
        t = self.tree.copy()
        perm = [int(x) for x in self.rng.permutation(self.num_pages)]
        for n in t.nodes:
            n[3] = [perm[p] for p in n[3]]
        self.pool.free = [perm[p] for p in self.pool.free]
        self.pool.freed_set = {perm[p] for p in self.pool.freed_set}
        moved = any(a[3] != b[3] for a, b in zip(t.nodes, self.tree.nodes))
        self.plan_tree("remap", t, "fresh" if moved else None)

    def step_big_then_tiny(self):
        """A tree close to every capacity, then a one- or two-node one."""
        c = self.cfg
        self._free_tree(self.tree)
        self.tree = None
        t = Tree(self.ps)
        while len(t.nodes) < c["max_nodes"]:
            tok = int(self.rng.integers(0, self.max_tokens + 1)) if t.nodes else self.max_tokens
            if not self._room(t, 1, self._pages_for(tok)):
                tok = 0
                if len(t.nodes) + 1 > c["max_nodes"]:
                    break
            par = int(self.rng.integers(len(t.nodes))) if t.nodes else -1
            self._new_node(t, par, tok, self.rng.random() < 0.3)
        leaves = t.childless()
        t.queries = [int(self.rng.choice(leaves)) for _ in range(c["max_queries"])]
        self.plan_tree("big", t, None)
        self.run_and_check("big")
        small = self.new_tree(nodes=int(self.rng.integers(1, 3)), queries=int(self.rng.integers(1, 3)))
        self.plan_tree("tiny", small, "fresh")

    # -- invalid plan_tree inputs -------------------------------------------------------------------------------
    def step_invalid(self):
        t = self.tree
        a = t.arrays("always")
        c = self.cfg
        kinds = ["page_out_of_range", "page_twice", "cycle", "query_range", "page_count", "too_many_queries",
                 "too_many_nodes", "too_many_page_refs", "float_tokens", "offsets_decrease"]
        kind = str(self.rng.choice(kinds))
        b = {k: (list(x) if x is not None else None) for k, x in a.items()}
        n = len(b["parents"])
        if kind == "page_out_of_range":
            if not b["page_ids"]:
                kind = "cycle"
            else:
                b["page_ids"][int(self.rng.integers(len(b["page_ids"])))] = int(
                    self.rng.choice([self.num_pages, self.num_pages + 7, -1, 2 ** 31 - 1]))
        if kind == "page_twice":
            owners = [(v, p) for v in range(n) for p in t.own_pages(v)]
            if len(owners) < 2:
                kind = "cycle"
            else:
                # Node w's own page i replaced by a page node v uses from slot 0: both use slot 0.
                i, j = self.rng.choice(len(owners), 2, replace=False)
                (v, p), (w, q) = owners[i], owners[j]
                pos = b["page_offsets"][w] + t.nodes[w][3].index(q)
                b["page_ids"][pos] = p
        if kind == "cycle":
            v = int(self.rng.integers(n))
            # v's parent becomes v itself or one of its descendants.
            desc = [v]
            for _ in range(n):
                desc += [u for u in range(n) if b["parents"][u] in desc and u not in desc]
            b["parents"][v] = int(self.rng.choice(desc))
        elif kind == "query_range":
            b["query_nodes"][int(self.rng.integers(len(b["query_nodes"])))] = int(self.rng.choice([n, -1, n + 5]))
        elif kind == "page_count":
            v = int(self.rng.integers(n))
            b["num_tokens"][v] += self.ps * int(self.rng.integers(1, 3))
        elif kind == "too_many_queries":
            b["query_nodes"] += [0] * (c["max_queries"] + 1 - len(b["query_nodes"]))
        elif kind == "too_many_nodes":
            extra = c["max_nodes"] + 1 - n
            b["parents"] += [-1] * extra
            b["num_tokens"] += [0] * extra
            b["first_slots"] += [0] * extra
            b["page_offsets"] += [b["page_offsets"][-1]] * extra
        elif kind == "too_many_page_refs":
            extra = self.max_page_refs + 1 - len(b["page_ids"])
            b["parents"].append(-1)
            b["num_tokens"].append(extra * self.ps)
            b["first_slots"].append(0)
            b["page_ids"] += [int(x) for x in self.rng.integers(0, self.num_pages, extra)]
            b["page_offsets"].append(len(b["page_ids"]))
        elif kind == "float_tokens":
            b["num_tokens"] = np.asarray(b["num_tokens"], dtype=np.float32)
        elif kind == "offsets_decrease":
            if n < 2:
                b["page_offsets"] = b["page_offsets"][:-1]
            else:
                v = int(self.rng.integers(1, n))
                b["page_offsets"][v] = b["page_offsets"][-1] + 1
        self._expect_refused(kind, lambda: self.attn.plan_tree(**b))

    # -- block tables -------------------------------------------------------------------------------------------
    def _bt_alloc(self, n):
        pages = [self.bt_pool.alloc() for _ in range(n)]
        self._fresh_pages(pages)
        return pages

    def _bt_own(self, s):
        """Pages of sequence s no other sequence holds."""
        others = {p for j, (pg, _) in enumerate(self.bt) if j != s for p in pg}
        return [p for p in self.bt[s][0] if p not in others]

    def _bt_new(self):
        ps = self.ps
        if self.bt:
            self.bt_pool.release(sorted({p for pages, _ in self.bt for p in pages}))
        seqs = []
        budget = self.max_page_refs
        nseq = int(self.rng.integers(1, self.cfg["max_queries"] + 1))
        while len(seqs) < nseq:
            prefix_pages = int(self.rng.integers(0, 4))
            if len(self.bt_pool.free) < prefix_pages + 8 or budget < prefix_pages + 4:
                break
            prefix = self._bt_alloc(prefix_pages)  # full pages, shared by the group
            for _ in range(int(self.rng.integers(1, 5))):
                if len(seqs) >= nseq:
                    break
                own = int(self.rng.integers(0 if prefix_pages else 1, self.max_tokens + 1))
                npg = cdiv(own, ps)
                if len(self.bt_pool.free) < npg + 4 or budget < prefix_pages + npg:
                    break
                seqs.append([prefix + self._bt_alloc(npg), prefix_pages * ps + own])
                budget -= npg
            budget -= prefix_pages
        while len(seqs) > 1 and not self._bt_fits(seqs):
            gone = seqs.pop()
            self.bt_pool.release([p for p in gone[0] if all(p not in q for q, _ in seqs)])
        if not seqs:
            seqs = [[self._bt_alloc(1), 1]]
        self.bt = seqs

    def _bt_arrays(self, seqs):
        ps = self.ps
        need = max(len(p) for p, _ in seqs)
        width = need + int(self.rng.integers(0, 3))
        pad = int(self.rng.choice([-1, 0, 2 ** 31 - 1, 12345]))
        table = np.full((len(seqs), width), pad, dtype=np.int32)
        for s, (pages, n) in enumerate(seqs):
            assert len(pages) == cdiv(n, ps)
            table[s, :len(pages)] = pages
        return table, np.asarray([n for _, n in seqs], dtype=np.int32)

    def _bt_fits(self, seqs):
        """The batch's tree (as plan_block_tables builds it) within max_nodes / max_page_refs / max_queries."""
        parent, children, ends = {}, collections.Counter(), set()
        for pages, _ in seqs:
            prev = None
            for p in pages:
                if p not in parent:
                    parent[p] = prev
                    children[prev] += 1
                prev = p
            ends.add(prev)
        nodes = sum(1 for p, par in parent.items() if par is None or children[par] != 1 or par in ends)
        self._bt_nodes = nodes
        return (nodes <= self.cfg["max_nodes"] and len(parent) <= self.max_page_refs
                and len(seqs) <= self.cfg["max_queries"])

    def _bt_plan(self, kind, expect):
        ps = self.ps
        table, lens = self._bt_arrays(self.bt)
        rows = [[p[i // ps] * ps + i % ps for i in range(n)] for p, n in self.bt]
        used = self._used_rows(rows)
        r = self.rng.random()
        if r < 0.4:
            tb = table
        elif r < 0.7:  # a view of a buffer the caller overwrites next time
            buf = self._bufs.setdefault("block_tables", np.zeros(1 << 14, dtype=np.int32))
            buf[:] = -7
            buf[:table.size] = table.ravel()
            tb = buf[:table.size].reshape(table.shape)
        else:
            tb = torch.from_numpy(table.copy())
        assert self._bt_fits(self.bt)
        self._plan(kind, lambda: self.attn.plan_block_tables(tb, lens), rows, used, expect, True, self._bt_nodes)
        self.bt_state_in_force = [(list(p), n) for p, n in self.bt]
        self.force_is_tree = False

    def step_block_tables(self):
        r = self.rng.random()
        in_force = getattr(self, "bt_state_in_force", None) is not None and self.force["kind"].startswith("bt")
        if self.bt is None or r < 0.25:
            self._bt_new()
            return self._bt_plan("bt_new", None)
        if r < 0.65:  # a decode step: sequences grow
            ps = self.ps
            sole_all = True
            grew = False
            for s, seq in enumerate(self.bt):
                if self.rng.random() < 0.3:
                    continue
                g = int(self.rng.choice([1, 1, 1, ps, 2 * ps + 1]))
                need = cdiv(seq[1] + g, ps) - len(seq[0])
                if len(self.bt_pool.free) < need + 2 or not self._bt_fits(
                        self.bt[:s] + [[seq[0] + [-1 - i for i in range(need)], seq[1] + g]] + self.bt[s + 1:]):
                    continue
                sole = seq[0] and seq[0][-1] in self._bt_own(s)
                sole_all &= bool(sole)
                seq[0] += self._bt_alloc(need)
                seq[1] += g
                grew = True
            expect = "extend" if in_force and sole_all else None
            self.counts["bt_grew" if grew else "bt_same"] += 1
            return self._bt_plan("bt_grow", expect)
        if r < 0.8:  # a sequence forks: full pages shared, the partial last page copied
            if len(self.bt) >= self.cfg["max_queries"]:
                return self._bt_finish()
            s = int(self.rng.integers(len(self.bt)))
            pages, n = self.bt[s]
            full = n // self.ps
            new = list(pages[:full])
            if n % self.ps:
                (cp,) = self._bt_alloc(1)
                src = pages[full]
                idx = torch.arange(n % self.ps)
                self.master_k[cp * self.ps + idx] = self.master_k[src * self.ps + idx]
                self.master_v[cp * self.ps + idx] = self.master_v[src * self.ps + idx]
                new.append(cp)
            at = int(self.rng.integers(len(self.bt) + 1))
            if not self._bt_fits(self.bt[:at] + [[new, n]] + self.bt[at:]):
                self.bt_pool.release(new[full:])
                return self._bt_finish()
            self.bt.insert(at, [new, n])
            return self._bt_plan("bt_fork", None)
        if r < 0.85:
            return self._bt_finish()
        if r < 0.9:
            return self._bt_shuffle()
        return self._bt_invalid()

    def _bt_shuffle(self):
        """The same lengths, but a sequence's own pages moved to others (content copied) or the sequences
        reordered: no longer a growth of the last batch."""
        if self.rng.random() < 0.5 and len(self.bt) > 1:
            order = [int(x) for x in self.rng.permutation(len(self.bt))]
            self.bt = [self.bt[i] for i in order]
            self.counts["bt_reorder"] += 1
            return self._bt_plan("bt_shuffle", None)
        s = int(self.rng.integers(len(self.bt)))
        own = self._bt_own(s)
        if not own:
            return self._bt_finish()
        moved = {}
        for p in own:
            (q,) = [self.bt_pool.alloc() for _ in range(1)]
            idx = torch.arange(self.ps)
            self.master_k[q * self.ps + idx] = self.master_k[p * self.ps + idx]
            self.master_v[q * self.ps + idx] = self.master_v[p * self.ps + idx]
            moved[p] = q
        self.bt[s][0] = [moved.get(p, p) for p in self.bt[s][0]]
        self.bt_pool.release(own)
        self.counts["bt_repage"] += 1
        return self._bt_plan("bt_shuffle", "fresh" if self.force["kind"].startswith("bt") else None)

    def _bt_finish(self):
        if len(self.bt) < 2:
            return self._bt_plan("bt_same", "extend" if self.force["kind"].startswith("bt") else None)
        s = int(self.rng.integers(len(self.bt)))
        self.bt_pool.release(self._bt_own(s))
        del self.bt[s]
        return self._bt_plan("bt_finish", None)

    def _bt_invalid(self):
        ps = self.ps
        table, lens = self._bt_arrays(self.bt)
        kind = str(self.rng.choice(["bt_page_range", "bt_short_table", "bt_len0", "bt_partial_shared",
                                    "bt_over_page_refs", "bt_over_nodes"]))
        if kind == "bt_over_page_refs":
            # A decode step of one sequence past max_page_refs, with the pages the next valid step will be handed
            # (the free list is LIFO): built by plan_block_tables (the growth path where the sequence ends alone)
            # then refused by the plan; the next step's build must not trust the refused batch.
            uniq = len({p for pages, _ in self.bt for p in pages})
            extra = self.max_page_refs + 1 - uniq
            if extra > len(self.bt_pool.free) - 1:
                kind = "bt_page_range"
            else:
                seqs = [[list(p), n] for p, n in self.bt]
                s = int(self.rng.integers(len(seqs)))
                pages, n = seqs[s]
                seqs[s] = [pages + self.bt_pool.free[::-1][:extra], len(pages) * ps + (extra - 1) * ps + 1]
                table, lens = self._bt_arrays(seqs)
                self._expect_refused(kind, lambda: self.attn.plan_block_tables(table, lens))
                return
        if kind == "bt_over_nodes":
            seqs = [[list(p), n] for p, n in self.bt]
            while self._bt_fits(seqs) and len(seqs) < self.cfg["max_queries"] and len(seqs) < 64:
                pages, n = seqs[int(self.rng.integers(len(seqs)))]
                full = n // ps
                if full == 0:
                    break
                seqs.append([pages[:full], full * ps])  # a sequence ending at a full shared page
                j = int(self.rng.integers(len(seqs)))
                seqs.append([pages[:max(1, full - 1)] + self.bt_pool.free[-1 - j:][:1], max(1, full - 1) * ps + 1])
            if self._bt_fits(seqs):
                kind = "bt_page_range"
            else:
                table, lens = self._bt_arrays(seqs)
                self._expect_refused(kind, lambda: self.attn.plan_block_tables(table, lens))
                return
        table, lens = table.copy(), lens.copy()
        s = int(self.rng.integers(len(self.bt)))
        if kind == "bt_partial_shared":
            part = [j for j, (p, n) in enumerate(self.bt) if n % ps]
            if not part or ps == 1:
                kind = "bt_page_range"
            else:
                # Sequence j continues through the partial last page of part[0]: that page would hold two prefixes.
                a = part[0]
                pa, na = self.bt[a]
                row = list(pa) + [int(x) for x in self.rng.integers(0, self.num_pages, 1)]
                if len(row) > table.shape[1]:
                    table = np.concatenate([table, np.zeros((len(table), len(row) - table.shape[1]), np.int32)], 1)
                j = len(table)
                table = np.concatenate([table, np.zeros((1, table.shape[1]), np.int32)])
                table[j, :len(row)] = row
                lens = np.append(lens, len(row) * ps).astype(np.int32)
        if kind == "bt_page_range":
            table[s, int(self.rng.integers(len(self.bt[s][0])))] = int(self.rng.choice([self.num_pages, -3]))
        elif kind == "bt_short_table":
            lens[s] = table.shape[1] * ps + 1
        elif kind == "bt_len0":
            lens[s] = int(self.rng.choice([0, -1]))
        self._expect_refused(kind, lambda: self.attn.plan_block_tables(table, lens))

    # -- draft trees --------------------------------------------------------------------------------------------
    def step_tree_queries(self):
        t = self.tree
        a = t.arrays()
        per_node = self._tree_rows(a)
        used = self._used_rows(per_node)
        c = self.cfg
        room = min(c["max_queries"] - len(t.queries), c["max_nodes"] - len(t.nodes),
                   self.max_page_refs - t.page_refs())
        if room < 1:
            return self.step_block_tables()
        k = int(self.rng.integers(1, min(room, 12) + 1))
        free_rows = np.flatnonzero(~used)
        # Prefer the slots right after the query nodes' tails (drafts written after the prefix), then any free row.
        tails = []
        for v in sorted(set(t.queries)):
            e = t.end_slot(v) % self.ps
            if t.nodes[v][3] and e:
                last = t.nodes[v][3][-1] * self.ps
                tails += [last + s for s in range(e, self.ps) if not used[last + s]]
        pool = list(dict.fromkeys(tails + [int(x) for x in self.rng.permutation(free_rows)[:3 * k]]))
        if len(pool) < k:
            return self.step_same()
        rows = [int(x) for x in (pool[:k] if self.rng.random() < 0.5 else self.rng.permutation(pool)[:k])]
        draft_parents, draft_nodes = [], []
        for i in range(k):
            par = int(self.rng.integers(-1, i)) if i and self.rng.random() < 0.7 else -1
            draft_parents.append(par)
            node = int(self.rng.choice(t.queries)) if self.rng.random() < 0.8 else int(self.rng.integers(len(t.nodes)))
            draft_nodes.append(node if par < 0 or self.rng.random() < 0.5 else int(self.rng.integers(-5, 5)))
        qrows = [per_node[q] for q in t.queries]
        for i in range(k):
            chain = []
            j = i
            while draft_parents[j] >= 0:
                chain.append(rows[j])
                j = draft_parents[j]
            chain.append(rows[j])
            qrows.append(per_node[draft_nodes[j]] + chain)
        used_all = self._used_rows(per_node, rows)
        # Fresh K/V for the draft rows (their tokens were just written).
        self._fill_rows(rows)
        draft_pages = [r // self.ps for r in rows]
        shared = t.shares_pages() or len(set(draft_pages)) < k or bool(set(draft_pages) & {p for n in t.nodes for p in n[3]})
        if self.rng.random() < 0.15:
            self._invalid_drafts(a, draft_nodes, draft_parents, rows, used)
        args = self._as_inputs(a)
        dn, dp, dr = draft_nodes, draft_parents, rows
        if self.rng.random() < 0.5:
            dn, dp, dr = np.asarray(dn, np.int32), np.asarray(dp, np.int32), np.asarray(dr, np.int64)
        self._plan("tree_queries", lambda: self.attn.plan_tree_queries(
            **args, draft_nodes=dn, draft_parents=dp, draft_rows=dr), qrows, used_all, "fresh", not shared,
            len(t.nodes) + k)
        self.counts["drafts"] += k
        self.bt_state_in_force = None
        self.force_is_tree = False
        if self.rng.random() < 0.4:
            # The same step as an explicit tree: the drafts as one-token nodes at their rows (first_slots). It is
            # the tree in force, so plan_tree extends the plan plan_tree_queries made (when its page bits hold).
            self.run_and_check("drafts")
            ps = self.ps
            ex = dict(parents=a["parents"] + [len(t.nodes) + p if p >= 0 else draft_nodes[i]
                                              for i, p in enumerate(draft_parents)],
                      num_tokens=a["num_tokens"] + [1] * k,
                      page_offsets=a["page_offsets"] + [len(a["page_ids"]) + i + 1 for i in range(k)],
                      page_ids=a["page_ids"] + [r // ps for r in rows],
                      query_nodes=a["query_nodes"] + [len(t.nodes) + i for i in range(k)],
                      first_slots=[n[2] for n in t.nodes] + [r % ps for r in rows])
            ea = self._as_inputs(ex)
            self._plan("tq_as_tree", lambda: self.attn.plan_tree(**ea), qrows, used_all, "extend", not shared,
                       len(t.nodes) + k)

    def _invalid_drafts(self, a, dn, dp, rows, used):
        k = len(rows)
        kind = str(self.rng.choice(["draft_row_taken", "draft_row_twice", "draft_parent_forward", "draft_row_range"]))
        dn, dp, rows = list(dn), list(dp), list(rows)
        i = int(self.rng.integers(k))
        taken = np.flatnonzero(used)
        if kind == "draft_row_taken" and len(taken):
            rows[i] = int(self.rng.choice(taken))
        elif kind == "draft_row_twice" and k > 1:
            j = (i + 1) % k
            rows[i] = rows[j]
        elif kind == "draft_parent_forward":
            dp[i] = int(self.rng.integers(i, k + 2))
        else:
            kind = "draft_row_range"
            rows[i] = int(self.rng.choice([-1, self.num_pages * self.ps]))
        self._expect_refused(kind, lambda: self.attn.plan_tree_queries(
            **a, draft_nodes=dn, draft_parents=dp, draft_rows=rows))

    # -- the walk -----------------------------------------------------------------------------------------------
    STEPS = [("decode", 6), ("grow", 30), ("same", 4), ("change", 18), ("remap", 4), ("big", 2), ("invalid", 8),
             ("bt", 16), ("tq", 8), ("new", 3)]

    def step_decode_streak(self):
        """A streak of decode steps, each run."""
        for _ in range(int(self.rng.integers(3, 16))):
            self.step_grow()
            self.run_and_check("decode")

    def step(self):
        self.step_no += 1
        if self.tree is None:
            self.plan_tree("new", self.new_tree(), None)
        else:
            names, w = zip(*self.STEPS)
            kind = names[int(self.rng.choice(len(names), p=np.asarray(w) / sum(w)))]
            self.history.append(kind)
            {"grow": self.step_grow, "same": self.step_same, "change": self.step_change, "remap": self.step_remap,
             "big": self.step_big_then_tiny, "invalid": self.step_invalid, "bt": self.step_block_tables,
             "tq": self.step_tree_queries, "decode": self.step_decode_streak,
             "new": lambda: self.plan_tree("new", self.new_tree(), None)}[kind]()
        for _ in range(int(self.rng.integers(1, 3))):
            self.run_and_check()

    def walk(self, steps):
        for _ in range(steps):
            self.step()
        self.counts["page_reuse"] = self.pool.reused + self.bt_pool.reused
        return self.counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed0", type=int, default=1000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    total = collections.Counter()
    worst = collections.defaultdict(float)
    seed = args.seed0
    failures = []
    while time.time() - t0 < args.minutes * 60:
        p = Probe(seed)
        try:
            p.walk(args.steps)
        except Exception as e:  # noqa: BLE001 -- report and go on
            failures.append((seed, p.step_no, p.cfg, repr(e)[:2000], p.history[-8:]))
            print("FAIL seed", seed, "step", p.step_no, p.cfg, repr(e)[:2000], p.history[-8:], flush=True)
        total.update(p.counts)
        for k, v in p.worst.items():
            worst[k] = max(worst[k], v)
        seed += 1
    print(f"seeds {args.seed0}..{seed - 1} ({seed - args.seed0}), {args.steps} steps each, "
          f"{time.time() - t0:.0f} s, failures {len(failures)}")
    print("worst", dict(worst))
    print(dict(sorted(total.items())))


if __name__ == "__main__":
    main()
