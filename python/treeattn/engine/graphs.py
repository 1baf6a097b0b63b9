"""CUDA graphs per batch-size bucket for the decode step (embedding, every layer with its
attention run(), final norm, LM head); speculative verification steps (speculative.py) replay
the same graphs, bucketed by their token count. Inputs live in static buffers; a batch is
padded to its bucket with queries on a one-token scratch node. treeattn re-plans into the fixed
device buffers it allocated at construction, so a graph captured once stays valid across
re-plans: plan_tree() runs outside the graph before every replay.

A bucket's graphs are kept per attention launch set (TreeAttention.plan_launches): a step's
plan replays the graph captured under its own launches, which holds no empty attention launch
(2-3 us each, per layer) but the 128-row one, recorded last where the plan leaves it empty.
Any graph runs any plan correctly, so a bucket captured
in advance by prepare() (every launch, before a timed loop) serves every step of that bucket;
otherwise ensure() captures the step's launch set the first time a plan needs it."""
import torch

from .contexts import DecodeContext
from .errors import InputError


def buckets_up_to(max_tokens):
    """The step sizes captured: 1, 2, 4, 8, then multiples of a quarter of the power of two
    below (at least 8): 16, 24, ..., 64, 80, ..., 128, 160, ..., 256, 320, ..., and max_tokens.
    A step runs on the smallest bucket that holds it, so its dense layers compute at most
    1/4 padding rows past 32 (powers of two alone waste up to half a large batch)."""
    sizes, b = [], 1
    while b < max_tokens:
        sizes.append(b)
        step = max(8, (1 << (b.bit_length() - 1)) // 4) if b >= 8 else b
        b += step
    return sizes + [max_tokens]


class GraphRunner:
    def __init__(self, engine, max_tokens):
        if engine.device.type != "cuda":
            raise InputError(f"graphs: CUDA graphs need a cuda device, got {engine.device}")
        if not torch.cuda.is_available():
            raise InputError("graphs: torch reports no CUDA device")
        self.engine = engine
        self.buckets = buckets_up_to(max_tokens)
        dev = engine.device
        self.scratch_row = engine.scratch_page * engine.page_size
        # ids, positions, slots: rows of one buffer, filled by one host-to-device copy
        self.inputs = torch.zeros((3, max_tokens), dtype=torch.long, device=dev)
        self.inputs[2] = self.scratch_row
        self.ids, self.positions, self.slots = self.inputs

        # (bucket, attention launches) -> graph and its static logits
        self.graphs, self.logits, self.pool = {}, {}, None
        self.every_launch = engine.attention.graph_launches   # the default: every launch but the m128 skip variant's

    def bucket(self, n):
        """The smallest bucket that holds n queries."""
        return next(b for b in self.buckets if b >= n)

    def pad(self, inputs, start, stop):
        """Columns [start, stop) of inputs (ids, positions, slots; the static buffer or the
        engine's host staging) as padded queries: they write their K/V into the scratch
        page, read only by themselves."""
        inputs[0, start:stop] = 0
        inputs[1, start:stop] = 0
        inputs[2, start:stop] = self.scratch_row

    def _forward(self, b):
        e = self.engine
        return e.model(self.ids[:b], self.positions[:b], self.slots[:b], e.kv,
                       DecodeContext(e.attention))

    def capture(self, b, launches=None):
        """Capture bucket b under attention graph launches `launches` (all inputs padded while
        capturing). None: every launch, with a plan of padding queries (prepare()); else the
        plan in force, which the engine made for b queries, is kept."""
        e = self.engine
        self.pad(self.inputs, 0, b)
        if launches is None:
            e.drop_prepared()   # capturing re-plans
            e.attention.plan_tree(*e.forest([], num_queries=b))
            launches = self.every_launch
        e.attention.graph_launches = launches
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up: cuBLAS handles, allocator, lazy init
            for _ in range(2):
                self._forward(b)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[b, launches] = self._forward(b)
        self.pool = graph.pool()   # buckets share one memory pool
        self.graphs[b, launches] = graph

    def prepare(self, n):
        """Capture the bucket of n sequences now (every launch: it serves any plan) if it has
        no graph yet; tot.py calls it for every bucket before its timed loop, so no step's
        time includes a capture. Returns the bucket."""
        b = self.bucket(n)
        if not any(key[0] == b for key in self.graphs):
            self.capture(b)
        return b

    def graph_key(self, b):
        """The graph that runs the plan in force on bucket b: the one of its launch set, else
        the bucket's every-launch graph (None: neither is captured)."""
        key = (b, self.engine.attention.plan_launches)
        if key in self.graphs:
            return key
        return (b, self.every_launch) if (b, self.every_launch) in self.graphs else None

    def ensure(self, b):
        """After the engine planned a step of bucket b: capture the graph of the plan's launch
        set if no graph of the bucket serves it yet (the plan stays in force)."""
        if self.graph_key(b) is None:
            self.capture(b, self.engine.attention.plan_launches)

    def decode(self, n, inputs, ids=None):
        """Replay the bucket of n queries (captured and planned by the engine already);
        inputs: the engine's host staging [3, max_tokens] (ids, positions, slots), padded
        here and uploaded in one copy; ids (optional): the n token ids on the device, which
        replace the staged ones."""
        b = self.bucket(n)
        self.pad(inputs, n, b)
        return self.replay(b, ids)[:n].clone()   # the static buffer is overwritten next replay

    def replay(self, b, ids=None):
        """Upload the engine's host staging (its first b columns filled, padding included),
        then ids (a device tensor, when given) over its first ids columns, and replay bucket b
        (captured, planned for b queries). Returns the graph's static logits [b, vocab]:
        valid until the next replay."""
        self.ensure(b)
        key = self.graph_key(b)
        self.engine._upload(self.inputs)
        if ids is not None:
            self.ids[:len(ids)].copy_(ids)   # device to device, after the upload on the stream
        self.graphs[key].replay()
        return self.logits[key]

    def time_attention(self, n):
        """Seconds of the current plan's attention alone: one run() per layer, replayed
        outside the graph (the graph itself cannot be timed per kernel)."""
        e, b = self.engine, self.bucket(n)
        cfg = e.model.cfg
        q = torch.randn(b, cfg.num_heads, cfg.head_dim, device=e.device, dtype=e.dtype)
        e.timer.reset()
        started = e.timer.start()
        for layer in range(cfg.num_layers):
            e.attention.run(q, e.kv.k[layer], e.kv.v[layer])
        e.timer.stop(started)
        torch.cuda.synchronize()
        return e.timer.total()
