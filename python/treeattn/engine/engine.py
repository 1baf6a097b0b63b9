"""The decode engine: a paged KV pool, a radix cache over token ids and an attention backend.
Sequences enter with add() (longest cached prefix reused, the rest prefilled, whole pages
published to the cache), split with fork() (parallel samples), and advance together with
decode(): one forest (cached radix paths + each sequence's tail node), one plan, one run()
per layer."""
import itertools
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from .contexts import AttentionTimer, DecodeContext, PrefillContext
from .errors import InputError
from .kv import KVPool


def is_int(x):
    """An integer, Python's or NumPy's, but not a bool (bools are Integral; NumPy's and
    PyTorch's are not)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_sizes(**sizes):
    """Each name=(value, least): an int >= least, else TypeError / ValueError naming it
    (num_pages counts the scratch page: a pool needs 2)."""
    for name, (value, least) in sizes.items():
        if not is_int(value):
            raise TypeError(f"{name}: expected an int, got {value!r}")
        if value < least:
            raise ValueError(f"{name} = {value}: expected >= {least}")


def _token_ids(name, tokens, vocab, max_len):
    """tokens as a list of ints in [0, vocab): ValueError / TypeError naming the first bad one.
    At most max_len + 1 of them are read (a longer prompt is refused by its length, not
    copied whole first); an iterator is read once."""
    if (isinstance(tokens, (str, bytes, bytearray, memoryview, Mapping)) or not hasattr(tokens, "__iter__")
            or _is_bool(tokens)):
        raise TypeError(f"{name}: expected a sequence of token ids (ints), got {type(tokens).__name__}")
    items = list(itertools.islice(tokens, max_len + 1))
    if not set(map(type, items)) <= {int}:   # else every id is a Python int (the common case)
        bad = next((t for t in items if _is_bool(t) or not _is_index(t)), None)
        if bad is not None:
            raise TypeError(f"{name}: token ids are ints, got {bad!r}")
    ids = [operator.index(t) for t in items]
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"{name}[{bad}] = {ids[bad]} is outside the vocabulary [0, {vocab})")
    return ids


def _is_bool(t):
    """A bool, NumPy's or PyTorch's too (or an array of them), which operator.index takes as 0 or 1."""
    return isinstance(t, (bool, np.bool_)) or str(getattr(t, "dtype", "")) in ("bool", "torch.bool")


def _is_index(t):
    try:
        operator.index(t)
        return True
    except TypeError:
        return False


def _live(s):
    """s is a Sequence that release() (or fork(), which releases its parent) has not ended."""
    return isinstance(s, Sequence) and s.node is not None


def _check_live(seqs, name="seqs"):
    """TypeError naming the first item that is not a Sequence; ValueError naming the first
    sequence already ended: its pages are back in the pool, possibly another sequence's."""
    for i, s in enumerate(seqs):
        if _live(s):
            continue
        where = f"seqs[{i}]" if name == "seqs" else name
        if not isinstance(s, Sequence):
            raise TypeError(f"{where}: expected a Sequence (from add() or fork()), got {s!r}")
        raise ValueError(f"{where}: a released sequence (release() or fork() ended it; its pages "
                         "may hold another sequence's KV now)")


def _repeated(seqs):
    """(i, j), i < j, where seqs[j] is seqs[i]; None when every sequence is there once."""
    if len(set(map(id, seqs))) == len(seqs):   # the common case, at C speed
        return None
    seen = {}
    for j, s in enumerate(seqs):
        i = seen.setdefault(id(s), j)
        if i != j:
            return i, j
    return None


@dataclass(eq=False)
class Sequence:
    """tokens[:cached_len] live in cached pages on the path of the locked radix `node`;
    tokens[cached_len:kv_len] in the sequence's own `tail` pages (cached_len is page-aligned,
    so token i of the tail sits at offset i % page_size). During decoding exactly one token,
    tokens[kv_len], is pending: its K/V is written by the next decode(). release() sets node
    to None: a released sequence is refused everywhere."""
    tokens: list
    node: object
    cached_len: int
    cached_pages: np.ndarray
    tail: list = field(default_factory=list)
    kv_len: int = 0
    prompt_len: int = 0


def _ceil_div(a, b):
    return -(-a // b)


class Engine:
    """model: CausalLM; attention: TreeAttention-like (plan_tree + run); cache: RadixCache-like
    built over num_pages - 1 pages: the pool's last page is scratch for padded queries.
    A step runs at most max_batch sequences and max_drafts speculative draft tokens
    (speculative.py): max_tokens = max_batch + max_drafts sizes the inputs and graph buckets."""

    def __init__(self, model, attention, cache, num_pages, page_size, max_batch=256,
                 graphs=False, prefill_chunk=1024, max_drafts=0):
        cfg = model.cfg
        check_sizes(num_pages=(num_pages, 2), page_size=(page_size, 1), max_batch=(max_batch, 1),
                    prefill_chunk=(prefill_chunk, 1), max_drafts=(max_drafts, 0))
        self.model, self.attention, self.cache = model, attention, cache
        self.page_size, self.max_batch, self.prefill_chunk = page_size, max_batch, prefill_chunk
        self.max_tokens = max_batch + max_drafts
        self.capacity = num_pages - 1          # pages the cache may hand out
        self.scratch_page = num_pages - 1
        w = model.model.embed_tokens.weight
        self.device, self.dtype = w.device, w.dtype
        self.kv = KVPool(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim,
                         self.device, self.dtype)
        self.timer = AttentionTimer(self.device)
        self._fc = self._ahead = self._staging = None
        self._turn = 0
        self.graphs = None
        if graphs:
            from .graphs import GraphRunner
            self.graphs = GraphRunner(self, self.max_tokens)

    # -- rows and pages -----------------------------------------------------------------
    def host_rows(self, seq, start, stop):
        """Pool rows of seq's tokens [start, stop) as an int64 NumPy array."""
        pages = np.concatenate([seq.cached_pages.astype(np.int64),
                                np.asarray(seq.tail, dtype=np.int64)])
        idx = np.arange(start, stop)
        return pages[idx // self.page_size] * self.page_size + idx % self.page_size

    def _rows(self, seq, start, stop):
        """Pool rows of seq's tokens [start, stop) on the device."""
        return torch.from_numpy(self.host_rows(seq, start, stop)).to(self.device)

    def reserve(self, seq, stop, what):
        """Grow seq's tail until it has pages for tokens up to `stop` (exclusive); `what`
        names the request in the error when the cache is full."""
        need = _ceil_div(stop - seq.cached_len, self.page_size) - len(seq.tail)
        if need > 0:
            seq.tail += self._alloc(need, what)

    def trim_tail(self, seq, num_pages):
        """Free seq's tail pages past its first num_pages. Callers keep every page holding
        KV (tokens below kv_len): the forest cache relies on a tail's pages never changing
        once a forest included them, as long as the sequence decodes."""
        if len(seq.tail) > num_pages:
            self.cache.free(seq.tail[num_pages:])
            del seq.tail[num_pages:]

    def _alloc(self, n, what):
        try:
            return [int(p) for p in self.cache.alloc(n)]
        except ValueError as e:
            raise InputError(f"{what}: KV cache full, {n} more pages of {self.page_size} tokens "
                             f"needed, cache holds {self.capacity} pages ({e})") from e

    # -- sequences ----------------------------------------------------------------------
    def add(self, tokens):
        """Prefill a prompt onto its longest cached prefix. Returns (seq, logits [vocab])."""
        given = len(tokens) if hasattr(tokens, "__len__") else None
        tokens = _token_ids("tokens", tokens, self.model.cfg.vocab_size, self.capacity * self.page_size)
        n = len(tokens)
        if n == 0:
            raise InputError("tokens: empty prompt")
        if _ceil_div(n, self.page_size) > self.capacity:   # n: at most one past the capacity (read so far)
            count = f"{given} tokens need {_ceil_div(given, self.page_size)} pages" if given is not None else \
                f"more than {self.capacity * self.page_size} tokens need more than {self.capacity} pages"
            raise InputError(f"prompt: {count} of {self.page_size}, the KV cache holds {self.capacity} pages")
        window = self.model.cfg.sliding_window
        if window and n > window:
            raise InputError(f"prompt: {n} tokens exceed the model's sliding_window {window}")
        # the last token is always computed: its logits give the first generated token
        node, cached, pages = self.cache.match_prefix(tokens[:n - 1])
        self.cache.lock(node)
        seq = Sequence(tokens, node, cached, np.asarray(pages, dtype=np.int32), prompt_len=n)
        seq.kv_len = cached
        try:
            seq.tail = self._alloc(_ceil_div(n - cached, self.page_size), "prompt")
            logits = self._prefill(seq, n)
        except BaseException:
            self.release(seq, publish=False)   # the cache keeps its invariants on failure
            raise
        self.publish(seq)
        return seq, logits

    def _prefill(self, seq, stop):
        """Compute K/V of tokens [kv_len, stop) chunk by chunk; logits of token stop-1."""
        logits = None
        for start in range(seq.kv_len, stop, self.prefill_chunk):
            end = min(start + self.prefill_chunk, stop)
            ids = torch.tensor(seq.tokens[start:end], device=self.device)
            positions = torch.arange(start, end, device=self.device)
            rows = self._rows(seq, 0, end)
            logits = self.model(ids, positions, rows[start:], self.kv,
                                PrefillContext(rows, start), logit_rows=[end - start - 1])
            seq.kv_len = end
        return logits[0]

    def publish(self, seq):
        """Hand seq's whole computed pages to the radix cache so later prompts share them."""
        _check_live([seq], "seq")
        self._invalidate()
        full = seq.kv_len // self.page_size * self.page_size
        if full <= seq.cached_len:
            return
        k = (full - seq.cached_len) // self.page_size
        pages = np.concatenate([seq.cached_pages, np.asarray(seq.tail[:k], dtype=np.int32)])
        node = self.cache.insert(seq.tokens[:full], pages)
        self.cache.lock(node)
        self.cache.unlock(seq.node)
        # pages the cache already held are freed by insert: read the path back
        _, matched, cached_pages = self.cache.match_prefix(seq.tokens[:full])
        assert matched == full, f"insert cached {matched} of {full} tokens"
        seq.node, seq.cached_len, seq.tail = node, full, seq.tail[k:]
        seq.cached_pages = np.asarray(cached_pages, dtype=np.int32)

    def fork(self, seq, n):
        """n sequences continuing seq (which is consumed). They share its cached pages;
        its leftover rows past the last whole page are copied into each child's tail (one
        copy for all children)."""
        if not is_int(n) or n < 1:
            raise ValueError(f"n: expected a number of children >= 1, got {n!r} (release(seq) ends a sequence)")
        if n > self.capacity:   # each child needs a page of its own to decode a token
            raise InputError(f"n = {n}: more children than the KV cache's {self.capacity} pages (each needs "
                             "one to decode)")
        _check_live([seq], "seq")
        self.publish(seq)
        left = seq.kv_len - seq.cached_len       # < page_size after publish
        children = []
        try:
            for _ in range(n):
                self.cache.lock(seq.node)
                child = Sequence(list(seq.tokens), seq.node, seq.cached_len,
                                 seq.cached_pages.copy(), kv_len=seq.kv_len,
                                 prompt_len=seq.prompt_len)
                children.append(child)
                if left:
                    child.tail = self._alloc(1, "fork")
            if left and children:
                src = self.host_rows(seq, seq.cached_len, seq.kv_len)
                dst = [self.host_rows(c, c.cached_len, c.kv_len) for c in children]
                rows = torch.from_numpy(np.stack([np.tile(src, len(children)), np.concatenate(dst)]))
                rows = rows.to(self.device)
                self.kv.copy_rows(rows[0], rows[1])
        except BaseException:
            for child in children:
                self.release(child, publish=False)
            raise
        self.release(seq, publish=False)
        return children

    def release(self, seq, publish=True):
        """Finish seq: optionally keep its whole pages cached, free its tail, unlock."""
        _check_live([seq], "seq")
        self._invalidate()
        if publish:
            self.publish(seq)
        self.cache.free(seq.tail)
        seq.tail = []
        self.cache.unlock(seq.node)
        seq.node = None

    # -- decode -------------------------------------------------------------------------
    def _reserve_slot(self, seq):
        pos = seq.kv_len - seq.cached_len
        if pos == len(seq.tail) * self.page_size:
            seq.tail.append(self._alloc(1, "decode")[0])
        window = self.model.cfg.sliding_window
        if window and seq.kv_len + 1 > window:
            raise InputError(f"decode: sequence of {seq.kv_len + 1} tokens exceeds the "
                             f"model's sliding_window {window}")

    def _slot(self, seq):
        """Pool row of seq's pending token tokens[kv_len] (its page already reserved)."""
        pos = seq.kv_len - seq.cached_len
        return seq.tail[pos // self.page_size] * self.page_size + pos % self.page_size

    def forest(self, seqs, num_queries=None):
        """plan_tree arrays: the radix paths of seqs' nodes, then one tail node per sequence
        (holding tokens [cached_len, kv_len] incl. the pending one), then, when padding to
        num_queries, a scratch node for the padded queries. (Fresh copies: the engine's own
        planning uses the cached arrays in place.)"""
        _check_live(seqs)
        return tuple(a.copy() for a in self._forest(seqs, num_queries))

    def _forest(self, seqs, num_queries=None):
        """forest() without copies. The structure (radix part, tail parents, queries, scratch
        node) is cached while the same sequences are decoded together and none of them is
        published, forked or released; a step then only rewrites the tails' num_tokens and,
        when a tail gained a page, the tails' page ids."""
        fc = self._fc
        if (fc is None or fc.num_queries != num_queries or len(fc.seqs) != len(seqs)
                or any(a is not b or a.node is not n or a.cached_len != c
                       for a, b, n, c in zip(seqs, fc.seqs, fc.nodes, fc.cached_list))):
            fc = self._fc = _ForestCache(self, seqs, num_queries)
        counts = np.fromiter((s.kv_len for s in seqs), np.int64, len(seqs)) + fc.one_minus_cached
        fc.update(seqs, counts, self.page_size)
        return fc.parents, fc.ntok, fc.offsets, fc.pages, fc.queries

    def _invalidate(self):
        """The radix cache or a sequence's cached pages changed: rebuild the forest and the
        plan prepared ahead (if any) next time."""
        self._fc = None
        self.drop_prepared()

    def drop_prepared(self):
        """Forget the plan prepare() made ahead, so that the next decode() plans again. A
        prepared plan is the one in force in the attention backend, made for the prepared
        batch's sequences at their current lengths and cached pages; decode() checks those,
        but not whether the backend still holds that plan. So whatever else plans the backend
        (a verification step's plan_tree_queries, a graph capture's plan of padding
        queries), or changes the radix cache or a sequence's cached pages, calls this
        first."""
        self._ahead = None

    def _bucket(self, n):
        return self.graphs.bucket(n) if self.graphs is not None else None

    def prepare(self, seqs):
        """Everything decode(seqs) does before it needs the pending tokens' ids: reserve
        each sequence's slot, build the forest and plan the attention (the plan's upload is
        stream-ordered after the work already queued, e.g. the previous step's replay).
        Called right after a decode() is launched, it overlaps the next step's host work
        with this step's GPU work; the next decode(seqs) finds it done, or redoes it if
        seqs changed in between. Returns False (nothing prepared) where decode(seqs) would
        raise: decode() then raises."""
        self._ahead = None
        if not 0 < len(seqs) <= self.max_batch or not all(map(_live, seqs)) or _repeated(seqs) is not None:
            return False
        try:
            for s in seqs:
                self._reserve_slot(s)
        except InputError:   # the cache is full: decode(seqs) raises it
            return False
        self._plan(seqs)
        return True

    def _plan(self, seqs):
        b = self._bucket(len(seqs))
        self.attention.plan_tree(*self._forest(seqs, num_queries=b))
        if b is not None:
            self.graphs.ensure(b)          # may capture the graph of this plan's launches
        self._ahead = (list(seqs), [s.kv_len for s in seqs], [s.cached_len for s in seqs], b)

    def _prepared(self, seqs):
        a = self._ahead
        return (a is not None and len(a[0]) == len(seqs)
                and all(x is y and x.kv_len == k and x.cached_len == c
                        for x, y, k, c in zip(seqs, a[0], a[1], a[2])))

    def decode(self, seqs, time_attention=False, ids=None):
        """One decode step of seqs: writes each pending token's K/V; returns logits [B, V]
        (launched: on a GPU they are ready once the stream reaches them).

        ids: the pending tokens' ids as a tensor [B] (int64) on the engine's device, e.g. the
        last step's sampled tokens before they reach the host. The step is then launched
        without reading them on the host: seq.tokens may lack its pending token, which the
        caller appends once it has it (before anything else reads seq.tokens: publish, fork,
        release). Default: read from seq.tokens[seq.kv_len]."""
        if not 0 < len(seqs) <= self.max_batch:
            raise ValueError(f"seqs: expected 1..max_batch={self.max_batch} sequences, "
                             f"got {len(seqs)}")
        n = len(seqs)
        if ids is not None and not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids: expected an int64 tensor [{n}] on {self.device}, got {type(ids).__name__}")
        if ids is not None and (ids.shape != (n,) or ids.dtype != torch.long or ids.device != self.device):
            raise ValueError(f"ids: expected an int64 tensor [{n}] on {self.device}, got "
                             f"{ids.dtype} {tuple(ids.shape)} on {ids.device}")
        pending = None
        if ids is None:
            # Each sequence's pending token, checked before any state changes.
            try:
                pending = [s.tokens[s.kv_len] for s in seqs]
            except AttributeError:   # not a Sequence
                _check_live(seqs)
                raise
            except IndexError:
                _check_live(seqs)
                i = next(i for i, s in enumerate(seqs) if len(s.tokens) <= s.kv_len)
                raise ValueError(f"seqs[{i}]: no pending token (kv_len {seqs[i].kv_len}, {len(seqs[i].tokens)} "
                                 "tokens): append the next token to seq.tokens before decode(), or pass ids") from None
            if not set(map(type, pending)) <= {int}:   # else every one is a Python int (the common case)
                for i, t in enumerate(pending):
                    if _is_bool(t) or not _is_index(t):
                        raise TypeError(f"seqs[{i}]: pending token {t!r} is not a token id (an int)")
                pending = [operator.index(t) for t in pending]
            vocab = self.model.cfg.vocab_size
            if not 0 <= min(pending) <= max(pending) < vocab:
                i = next(i for i, t in enumerate(pending) if not 0 <= t < vocab)
                raise ValueError(f"seqs[{i}]: pending token {pending[i]} is outside the vocabulary [0, {vocab})")
        if not self._prepared(seqs):
            repeated = _repeated(seqs)
            if repeated is not None:
                raise ValueError(f"seqs[{repeated[1]}] is seqs[{repeated[0]}]: a sequence decodes once a step")
            _check_live(seqs)
            for s in seqs:
                self._reserve_slot(s)
            self._plan(seqs)
        self._ahead = None                 # consumed: the next step plans again
        inputs = self._inputs()
        inputs[0, :n] = 0 if ids is not None else pending
        inputs[1, :n] = [s.kv_len for s in seqs]
        inputs[2, :n] = [self._slot(s) for s in seqs]
        if self.graphs is not None:
            logits = self.graphs.decode(n, inputs, ids)
        else:
            self.timer.reset()
            ctx = DecodeContext(self.attention, self.timer if time_attention else None)
            t = self._upload()
            if ids is not None:
                t[0, :n] = ids     # over the staged zeros (on a GPU: after the upload, on the stream)
            logits = self.model(t[0, :n], t[1, :n], t[2, :n], self.kv, ctx)
        for s in seqs:
            s.kv_len += 1
        return logits

    def _inputs(self):
        """The host staging [3, max_tokens] int64 (ids, positions, slots) to fill for this
        step, as a NumPy view. Two buffers (pinned on a GPU) used in turn; a buffer is
        refilled only once its previous upload has run (an event; the step's token read
        has synchronized long before in practice)."""
        if self._staging is None:
            cuda = self.device.type == "cuda"
            self._staging = [torch.zeros((3, self.max_tokens), dtype=torch.long, pin_memory=cuda)
                             for _ in range(2)]
            self._staging_np = [t.numpy() for t in self._staging]
            self._staged = [torch.cuda.Event(), torch.cuda.Event()] if cuda else None
            self._device_inputs = (torch.zeros((3, self.max_tokens), dtype=torch.long,
                                               device=self.device) if cuda else None)
        self._turn ^= 1
        if self._staged is not None:
            self._staged[self._turn].synchronize()   # returns at once if never recorded
        return self._staging_np[self._turn]

    def _upload(self, dst=None):
        """Copy this step's staging to dst (default: the engine's device buffer, or the
        staging itself on the CPU): one transfer for ids, positions and slots."""
        src = self._staging[self._turn]
        if dst is None:
            if self._device_inputs is None:
                return src
            dst = self._device_inputs
        dst.copy_(src, non_blocking=True)
        if self._staged is not None:
            self._staged[self._turn].record()
        return dst

    def attention_seconds(self, n):
        """Attention time of the last decode() of n sequences (called after its step was
        timed and synchronized; decode(time_attention=True) when graphs are off)."""
        if self.graphs is not None:
            return self.graphs.time_attention(n)
        return self.timer.total()


class _ForestCache:
    """The step-invariant part of Engine.forest() for one list of sequences: the radix
    paths (export_tree), each tail node's parent and index, the queries, the scratch node.
    update() writes a step's tail num_tokens and (when a tail's page count changed) the
    tails' page ids and offsets, in place."""

    def __init__(self, engine, seqs, num_queries):
        self.seqs, self.num_queries = list(seqs), num_queries
        self.nodes = [s.node for s in seqs]
        self.cached_list = [s.cached_len for s in seqs]
        # the same node twice (or two handles of one node) is fine: export_tree maps both to
        # one forest node; a root handle gets node_index -1, so its tails become roots
        nodes = list({id(n): n for n in self.nodes}.values())
        if nodes:
            parents, ntok, offsets, pages, index = engine.cache.export_tree(nodes)
        else:
            parents = ntok = pages = index = np.zeros(0, np.int32)
            offsets = np.zeros(1, np.int32)
        where = {id(n): int(i) for n, i in zip(nodes, index)}
        b, r = len(seqs), len(parents)
        pad = num_queries is not None and num_queries > b
        total = r + b + (1 if pad else 0)
        self.radix_pages = np.asarray(pages, dtype=np.int32)
        self.radix_offsets = np.asarray(offsets, dtype=np.int32)
        self.parents = np.empty(total, np.int32)
        self.parents[:r] = parents
        self.parents[r:r + b] = [where.get(id(n), -1) for n in self.nodes]
        self.ntok = np.empty(total, np.int32)
        self.ntok[:r] = ntok
        self.offsets = np.empty(total + 1, np.int32)
        self.offsets[:r + 1] = self.radix_offsets
        self.queries = np.arange(r, r + b, dtype=np.int32)
        if pad:
            self.parents[-1] = -1
            self.ntok[-1] = 1
            self.queries = np.concatenate(
                [self.queries, np.full(num_queries - b, r + b, np.int32)])
        self.scratch_page, self.pad, self.r, self.b = engine.scratch_page, pad, r, b
        self.one_minus_cached = 1 - np.asarray(self.cached_list, dtype=np.int64)
        self.tail_pages = None   # per tail: its page count in self.pages
        self.pages = None

    def update(self, seqs, counts, page_size):
        r, b = self.r, self.b
        self.ntok[r:r + b] = counts
        npages = (counts + page_size - 1) // page_size
        if self.tail_pages is not None and (np.array_equal(npages, self.tail_pages)
                                            or self._grow(seqs, npages)):
            return
        tails = [s.tail[:k] for s, k in zip(seqs, npages.tolist())]
        lens = np.fromiter(map(len, tails), np.int64, b)
        parts = [self.radix_pages, np.fromiter(
            (p for t in tails for p in t), np.int32, int(lens.sum()))]
        if self.pad:
            parts.append(np.array([self.scratch_page], np.int32))
        self.pages = np.concatenate(parts)
        base = int(self.radix_offsets[-1])
        self.offsets[r + 1:r + b + 1] = base + np.cumsum(lens)
        if self.pad:
            self.offsets[-1] = len(self.pages)
        # a tail without its pending token's page (not reserved yet) gives a forest
        # plan_tree rejects, as before; it is rebuilt once the page is there
        self.tail_pages = npages if np.array_equal(lens, npages) else None

    def _grow(self, seqs, npages):
        """The pages the tails gained since the last update, inserted at the ends of their
        ranges in one vectorised insert, the offsets after them shifted: a step's usual
        change, O(pages) in NumPy instead of a rebuild in Python. False (nothing changed)
        where a tail shrank or lacks a page it should have."""
        delta = npages - self.tail_pages
        if (delta < 0).any():
            return False
        grown = np.flatnonzero(delta)
        new = []
        for i in grown.tolist():
            tail, k = seqs[i].tail, int(npages[i])
            if len(tail) < k:
                return False
            new.extend(tail[int(self.tail_pages[i]):k])
        ends = self.offsets[self.r + 1 + grown]   # tail i's range ends at offsets[r + 1 + i]
        # equal positions keep the values' order: a tail's new pages stay in sequence
        self.pages = np.insert(self.pages, np.repeat(ends, delta[grown]),
                               np.asarray(new, np.int32))
        self.offsets[self.r + 1:self.r + self.b + 1] += np.cumsum(delta).astype(np.int32)
        if self.pad:
            self.offsets[-1] = len(self.pages)
        self.tail_pages = npages
        return True
