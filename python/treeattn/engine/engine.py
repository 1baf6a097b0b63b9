"""The decode engine: a paged KV pool, a radix cache over token ids and an attention backend.
Sequences enter with add() (longest cached prefix reused, the rest prefilled, whole pages
published to the cache), split with fork() (parallel samples), and advance together with
decode(): one forest (cached radix paths + each sequence's tail node), one plan, one run()
per layer."""
from dataclasses import dataclass, field

import numpy as np
import torch

from .contexts import AttentionTimer, DecodeContext, PrefillContext
from .kv import KVPool


@dataclass(eq=False)
class Sequence:
    """tokens[:cached_len] live in cached pages on the path of the locked radix `node`;
    tokens[cached_len:kv_len] in the sequence's own `tail` pages (cached_len is page-aligned,
    so token i of the tail sits at offset i % page_size). During decoding exactly one token,
    tokens[kv_len], is pending: its K/V is written by the next decode()."""
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
    built over num_pages - 1 pages: the pool's last page is scratch for padded queries."""

    def __init__(self, model, attention, cache, num_pages, page_size, max_batch=256,
                 graphs=False, prefill_chunk=1024):
        cfg = model.cfg
        self.model, self.attention, self.cache = model, attention, cache
        self.page_size, self.max_batch, self.prefill_chunk = page_size, max_batch, prefill_chunk
        self.capacity = num_pages - 1          # pages the cache may hand out
        self.scratch_page = num_pages - 1
        w = model.model.embed_tokens.weight
        self.device, self.dtype = w.device, w.dtype
        self.kv = KVPool(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim,
                         self.device, self.dtype)
        self.timer = AttentionTimer(self.device)
        self.graphs = None
        if graphs:
            from .graphs import GraphRunner
            self.graphs = GraphRunner(self, max_batch)

    # -- rows and pages -----------------------------------------------------------------
    def _rows(self, seq, start, stop):
        """Pool rows of seq's tokens [start, stop)."""
        pages = np.concatenate([seq.cached_pages.astype(np.int64),
                                np.asarray(seq.tail, dtype=np.int64)])
        idx = np.arange(start, stop)
        return torch.from_numpy(pages[idx // self.page_size] * self.page_size
                                + idx % self.page_size).to(self.device)

    def _alloc(self, n, what):
        try:
            return [int(p) for p in self.cache.alloc(n)]
        except ValueError as e:
            raise ValueError(f"{what}: KV cache full, {n} more pages of {self.page_size} tokens "
                             f"needed, cache holds {self.capacity} pages ({e})") from e

    # -- sequences ----------------------------------------------------------------------
    def add(self, tokens):
        """Prefill a prompt onto its longest cached prefix. Returns (seq, logits [vocab])."""
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        if n == 0:
            raise ValueError("tokens: empty prompt")
        if _ceil_div(n, self.page_size) > self.capacity:
            raise ValueError(f"prompt: {n} tokens need {_ceil_div(n, self.page_size)} pages of "
                             f"{self.page_size}, the KV cache holds {self.capacity} pages")
        window = self.model.cfg.sliding_window
        if window and n > window:
            raise ValueError(f"prompt: {n} tokens exceed the model's sliding_window {window}")
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
        its leftover rows past the last whole page are copied into each child's tail."""
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
                    src = self._rows(seq, seq.cached_len, seq.kv_len)
                    self.kv.copy_rows(src, self._rows(child, child.cached_len, child.kv_len))
        except BaseException:
            for child in children:
                self.release(child, publish=False)
            raise
        self.release(seq, publish=False)
        return children

    def release(self, seq, publish=True):
        """Finish seq: optionally keep its whole pages cached, free its tail, unlock."""
        if publish:
            self.publish(seq)
        self.cache.free(seq.tail)
        seq.tail = []
        self.cache.unlock(seq.node)

    # -- decode -------------------------------------------------------------------------
    def _reserve_slot(self, seq):
        pos = seq.kv_len - seq.cached_len
        if pos == len(seq.tail) * self.page_size:
            seq.tail.append(self._alloc(1, "decode")[0])
        window = self.model.cfg.sliding_window
        if window and seq.kv_len + 1 > window:
            raise ValueError(f"decode: sequence of {seq.kv_len + 1} tokens exceeds the "
                             f"model's sliding_window {window}")

    def forest(self, seqs, num_queries=None):
        """plan_tree arrays: the radix paths of seqs' nodes, then one tail node per sequence
        (holding tokens [cached_len, kv_len] incl. the pending one), then, when padding to
        num_queries, a scratch node for the padded queries."""
        # the same node twice (or two handles of one node) is fine: export_tree maps both to
        # one forest node; a root handle gets node_index -1, so its tails become roots
        nodes = list({id(s.node): s.node for s in seqs}.values())
        if nodes:
            parents, ntok, offsets, pages, index = self.cache.export_tree(nodes)
        else:
            parents = ntok = pages = index = np.zeros(0, np.int32)
            offsets = np.zeros(1, np.int32)
        where = {id(n): int(i) for n, i in zip(nodes, index)}
        parents, ntok, pages = list(parents), list(ntok), list(pages)
        offsets, queries = list(offsets), []
        for s in seqs:
            count = s.kv_len + 1 - s.cached_len
            queries.append(len(parents))
            parents.append(where.get(id(s.node), -1))
            ntok.append(count)
            pages.extend(s.tail[:_ceil_div(count, self.page_size)])
            offsets.append(len(pages))
        if num_queries is not None and num_queries > len(seqs):
            queries += [len(parents)] * (num_queries - len(seqs))
            parents.append(-1)
            ntok.append(1)
            pages.append(self.scratch_page)
            offsets.append(len(pages))
        as32 = lambda a: np.asarray(a, dtype=np.int32)
        return as32(parents), as32(ntok), as32(offsets), as32(pages), as32(queries)

    def decode(self, seqs, time_attention=False):
        """One decode step of seqs: writes each pending token's K/V; returns logits [B, V]."""
        if not 0 < len(seqs) <= self.max_batch:
            raise ValueError(f"seqs: expected 1..max_batch={self.max_batch} sequences, "
                             f"got {len(seqs)}")
        for s in seqs:
            self._reserve_slot(s)
        ids = [s.tokens[s.kv_len] for s in seqs]
        positions = [s.kv_len for s in seqs]
        slots = [int(self._rows(s, s.kv_len, s.kv_len + 1)[0]) for s in seqs]
        if self.graphs is not None:
            logits = self.graphs.decode(seqs, ids, positions, slots)
        else:
            self.attention.plan_tree(*self.forest(seqs))
            self.timer.reset()
            ctx = DecodeContext(self.attention, self.timer if time_attention else None)
            as_t = lambda a: torch.tensor(a, device=self.device)
            logits = self.model(as_t(ids), as_t(positions), as_t(slots), self.kv, ctx)
        for s in seqs:
            s.kv_len += 1
        return logits

    def attention_seconds(self, n):
        """Attention time of the last decode() of n sequences (called after its step was
        timed and synchronized; decode(time_attention=True) when graphs are off)."""
        if self.graphs is not None:
            return self.graphs.time_attention(n)
        return self.timer.total()
