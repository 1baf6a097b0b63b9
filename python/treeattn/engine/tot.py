"""Tree-of-thoughts on the engine: many ToT tasks decoded together, the batch being the
forest of their trees (one plan per step).

Each thought is a Branch holding an engine Sequence. A branch generates `value` tokens, one
per iteration (every generating branch of every task in one decode step); when it is done
its last logits are kept, and then either it is released (a pruned thought or a final
answer: its tail pages go back to the pool, its cached prefix stays only while another
branch locks it) or its children start: engine.fork() shares its whole pages through the
radix cache and copies the leftover of its last page, and each child samples its own first
token from the parent's last logits. Who gets how many children, of which length and when
is a policy's decision:

- ReplayPolicy (`tot:file=...`): a recorded schedule (recorded.py), so branching, lengths
  and pruning follow a real run; the token ids come from the model.
- LivePolicy (`tot-live:...`): rounds of `budget` tokens; after each round a task's branches
  are scored by the mean log-probability of their tokens from the root, the best `width`
  fork `k` children each, the others are pruned.

run_tot() is the loop; it releases every sequence it holds when it ends or fails, so the
cache's free count returns to its start value once the unreferenced cached pages are
evicted (the cache evicts them itself when it needs pages)."""
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import InputError, check_program_size, read_json
from .programs import COMMON, RunResult, _sync, parse_params
from .recorded import is_int, load_tot_file, scaled
from .sampling import SamplingParams, exponential_race, sample

# kind -> default parameters (each also takes COMMON's gen-less sampling keys); temperature
# defaults to 1: greedy siblings would repeat each other's tokens
TOT_KINDS = {
    "tot": dict(file="", tasks=0, scale=1.0, max_steps=0, leaves="free"),
    "tot-live": dict(prompt=1000, tasks=1, prompt_ids="", rounds=3, width=3, k=3, budget=32,
                     leaves="free"),
}
SAMPLING_KEYS = ("temperature", "top_p", "top_k")


@dataclass(eq=False)
class Branch:
    """One thought. Its sequence holds tokens [0, first_position) of its ancestors and its
    own tokens; while it generates, the last token is the pending one (K/V not written)."""
    task: int
    node: int                   # node id (replay) or creation order in its task (live)
    parent: "Branch"            # None for a task's root (the prompt)
    value: int                  # tokens it generates (the root: the prompt's length)
    start: int                  # iteration of its first token
    seq: object = None          # the engine Sequence while the branch or its children need it
    first_position: int = 0     # position of its first token
    generated: int = 0          # its tokens whose K/V is written
    next_logits: torch.Tensor = None    # once done: the logits its children sample from
    children_left: int = 0      # children not started yet
    path_logprob: float = 0.0   # log-probability of the generated tokens from the root on
    path_tokens: int = 0
    tokens: list = None         # once done: its full token list (ancestors' and its own)
    logits: list = field(default_factory=list)   # recorded rows (fp32, CPU), when asked:
    rows_from: int = 0          # the logits at positions rows_from, rows_from + 1, ...

    @property
    def score(self):
        return self.path_logprob / max(self.path_tokens, 1)


@dataclass
class ChildPlan:
    node: int
    value: int
    start: int


class ReplayPolicy:
    """Children, lengths and start iterations from recorded tasks (recorded.ToTTask)."""
    needs_scores = False

    def __init__(self, tasks):
        self.tasks = tasks
        self.batches = {}     # iteration -> decode queries of all tasks (none: left out)
        for task in tasks:
            for t, n in task.generating_counts().items():
                self.batches[t] = self.batches.get(t, 0) + n

    def roots(self):
        return [(i, t.root, t.nodes[t.root].value) for i, t in enumerate(self.tasks)]

    def children(self, done, iteration):
        nodes = [self.tasks[b.task].nodes for b in done]
        return [[ChildPlan(c, n[c].value, n[c].start) for c in n[b.node].children]
                for b, n in zip(done, nodes)]

    def max_batch(self):
        return max(self.batches.values(), default=1)

    def num_steps(self):
        return len(self.batches)

    def pages_needed(self, page_size):
        """Peak of the pages the forest holds, plus one per query (a step reserves its
        pending token's page while the previous step runs) and the scratch page. A node
        holds, from its start until the last iteration of its subtree, a page of leftover (a
        child's tokens start inside its parent's last page) and a page per page_size of its
        tokens, each from the iteration that writes the page's first token."""
        times, deltas = [], []
        for task in self.tasks:
            last = _subtree_ends(task)
            for n in task.nodes.values():
                own = -(-n.value // page_size)
                first = max(n.start, 0)            # the prompt's pages: all at iteration 0
                grows = np.maximum(n.start + page_size * np.arange(own), first)
                times += [first, last[n.id] + 1, *grows.tolist()]
                deltas += [1, -(own + 1), *([1] * own)]
        order = np.argsort(np.asarray(times), kind="stable")
        held = np.cumsum(np.asarray(deltas)[order])
        # events of one iteration apply together: the peak is over iteration ends
        ends = np.r_[np.diff(np.asarray(times)[order]) != 0, True]
        return int(held[ends].max()) + self.max_batch() + 2


def _subtree_ends(task):
    """node id -> the last iteration any node of its subtree is live."""
    last, order = {}, [task.root]
    for node_id in order:
        order.extend(task.nodes[node_id].children)
    for node_id in reversed(order):    # children before parents
        n = task.nodes[node_id]
        last[node_id] = max([n.end] + [last[c] for c in n.children])
    return last


class LivePolicy:
    """rounds of `budget` tokens; after a round the best `width` branches of each task (by
    score) fork k children each, the others are pruned; after the last round all end."""
    needs_scores = True

    def __init__(self, prompt_lengths, rounds, width, k, budget):
        for name, v in dict(rounds=rounds, width=width, k=k, budget=budget).items():
            if v < 1:
                raise InputError(f"program: tot-live {name}={v} must be >= 1")
        self.prompt_lengths, self.tasks = prompt_lengths, len(prompt_lengths)
        self.rounds, self.width, self.k, self.budget = rounds, width, k, budget
        self.created = [1] * self.tasks       # branches made per task (node ids)

    def roots(self):
        return [(i, 0, n) for i, n in enumerate(self.prompt_lengths)]

    def children(self, done, iteration):
        round_ = iteration // self.budget     # the round the done branches finished
        keep = set()
        if round_ < self.rounds:
            by_task = {}
            for b in done:
                by_task.setdefault(b.task, []).append(b)
            for group in by_task.values():
                keep.update(id(b) for b in sorted(group, key=lambda b: -b.score)[:self.width])
        plans = []
        for b in done:
            n = self.k if id(b) in keep else 0
            plans.append([ChildPlan(self.created[b.task] + i, self.budget, iteration + 1)
                          for i in range(n)])
            self.created[b.task] += n
        return plans

    def _widths(self):
        live, widths = self.k, []
        for _ in range(self.rounds):
            widths.append(live)
            live = min(live, self.width) * self.k
        return widths

    def max_batch(self):
        return self.tasks * max(self._widths())

    def num_steps(self):
        return self.rounds * self.budget

    def pages_needed(self, page_size):
        """Every round's branches at once (an upper bound), each with a page of leftover,
        plus the prompts and the scratch page."""
        prompts = sum(-(-n // page_size) for n in self.prompt_lengths)
        per_task = sum(w * (-(-self.budget // page_size) + 1) for w in self._widths())
        return prompts + self.tasks * per_task + 2


@dataclass
class ToTProgram:
    kind: str
    prompts: list            # one per task: random token ids (the recorded root length)
    policy: object
    sampling: SamplingParams
    max_steps: int = None
    publish_leaves: bool = False

    @property
    def max_batch(self):
        """Decode queries of the widest step: the engine's max_batch."""
        return self.policy.max_batch()

    @property
    def num_steps(self):
        steps = self.policy.num_steps()
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def pages_needed(self, page_size):
        return self.policy.pages_needed(page_size)


def is_tot_spec(spec):
    return spec.partition(":")[0] in TOT_KINDS


def make_tot_program(spec, vocab_size, seed=0, max_kv_tokens=None):
    """A ToTProgram from "tot:file=F,tasks=N,scale=S,max_steps=M,leaves=free|cache" or
    "tot-live:prompt=P,tasks=N,rounds=R,width=W,k=K,budget=B"; both take temperature
    (default 1), top_p, top_k. Prompts are random token ids (seeded) of the recorded root
    lengths (tot) or of length P (tot-live), or for tot-live prompt_ids=PATH: a JSON list of
    token id lists (one task each, tokenized outside, e.g. for a real checkpoint). The
    prompts' sizes are checked before they are made (errors.check_program_size;
    max_kv_tokens: the most KV tokens the device holds, kv.max_kv_tokens)."""
    kind, _, rest = spec.partition(":")
    defaults = dict(TOT_KINDS[kind], **{k: COMMON[k] for k in SAMPLING_KEYS})
    defaults["temperature"] = 1.0
    p = parse_params(kind, rest, defaults)
    if p["leaves"] not in ("free", "cache"):
        raise InputError(f"program: leaves={p['leaves']!r}: expected free or cache")
    rng = np.random.default_rng(seed)
    random_ids = lambda n: rng.integers(0, vocab_size, n).tolist()
    if kind == "tot":
        if not p["file"]:
            raise InputError("program: tot needs file=PATH (a recorded ToT file)")
        tasks = load_tot_file(p["file"], p["tasks"] or None)
        policy = ReplayPolicy([scaled(t, p["scale"]) for t in tasks])
        roots = [length for _, _, length in policy.roots()]
        check_program_size(f"program {spec!r}", sum(roots) + len(roots), sum(roots), max_kv_tokens)
        prompts = [random_ids(length) for length in roots]
    else:
        if p["prompt_ids"]:
            prompts = _load_prompt_ids(p["prompt_ids"], vocab_size)
        elif p["prompt"] < 1 or p["tasks"] < 1:
            raise InputError("program: tot-live prompt and tasks must be >= 1")
        else:
            check_program_size(f"program {spec!r}", p["tasks"] * (p["prompt"] + 1), p["tasks"] * p["prompt"],
                               max_kv_tokens)
            prompts = [random_ids(p["prompt"]) for _ in range(p["tasks"])]
        policy = LivePolicy([len(t) for t in prompts], p["rounds"], p["width"], p["k"],
                            p["budget"])
    sampling = SamplingParams(p["temperature"], p["top_p"], p["top_k"])
    return ToTProgram(kind, prompts, policy, sampling, p.get("max_steps") or None,
                      p["leaves"] == "cache")


def _load_prompt_ids(path, vocab_size):
    prompts = read_json(path, "prompt_ids")
    if not isinstance(prompts, list) or not prompts:
        raise InputError(f"{path}: expected a non-empty JSON list of token id lists")
    for i, ids in enumerate(prompts):
        if not isinstance(ids, list) or not ids or not all(
                is_int(t) and 0 <= t < vocab_size for t in ids):
            raise InputError(f"{path}: task {i}: expected a non-empty list of token ids in "
                             f"[0, {vocab_size})")
    return prompts


@dataclass
class ToTResult(RunResult):
    branches: list = field(default_factory=list)      # every Branch made (records, tests)
    end_to_end_seconds: float = 0.0
    attention_steps: list = field(default_factory=list)   # steps whose attention was timed
    free_pages_min: int = None      # the cache's free list at its lowest
    held_pages_peak: int = None     # pages neither free nor evictable, at the peak

    def summary(self):
        out = super().summary()
        del out["sequences"]      # seqs stays empty: a branch's sequence ends with it
        out.update(end_to_end_s=round(self.end_to_end_seconds, 4), branches=len(self.branches),
                   mean_batch=(sum(self.batch_sizes) / len(self.batch_sizes)
                               if self.batch_sizes else 0),
                   widest_batch=max(self.batch_sizes, default=0),
                   free_pages_min=self.free_pages_min, held_pages_peak=self.held_pages_peak)
        if self.attention_steps:    # timed on a sample of the steps: their share
            timed = sum(self.step_seconds[i] for i in self.attention_steps)
            out["attention_share"] = sum(self.attention_seconds) / timed
        return out


class _Run:
    """The state of one run_tot(): live branches, branches waiting to start, records."""

    def __init__(self, engine, program, seed, record_logits, check_cache):
        self.engine, self.program, self.policy = engine, program, program.policy
        self.gen = torch.Generator(device=engine.device).manual_seed(seed)
        self.record, self.check_cache = record_logits, check_cache
        self.generating = []        # branches decoding, in the order of the batch
        self.holding = []           # done branches keeping their sequence for children
        self.pending = {}           # iteration -> [(parent, ChildPlan)] to start then
        self.branches = []
        cache = engine.cache
        self.evictable = getattr(cache, "num_evictable_pages", None)
        self.free_min = cache.num_free_pages()
        self.held_peak = 0
        self.host_tokens = self.host_lp = self.copied = None   # sample_async's pinned buffers

    def note_pages(self):
        free = self.engine.cache.num_free_pages()
        self.free_min = min(self.free_min, free)
        if self.evictable is not None:
            self.held_peak = max(self.held_peak,
                                 self.engine.capacity - free - self.evictable())
        if self.check_cache:
            self.engine.cache.check()

    def _new(self, **kw):
        b = Branch(**kw)
        self.branches.append(b)
        return b

    def prefill(self):
        for (task, node, value), prompt in zip(self.policy.roots(), self.program.prompts):
            b = self._new(task=task, node=node, parent=None, value=value, start=1 - value)
            b.seq, logits = self.engine.add(prompt)
            b.generated = value
            if self.record:
                b.rows_from = value - 1           # the prompt's last position
                b.logits.append(logits.float().cpu())
            self.finish([b], [logits], iteration=0)

    def finish(self, done, logits_rows, iteration):
        """done branches wrote their last token; logits_rows: their last logits."""
        for b, row in zip(done, logits_rows):
            b.tokens, b.next_logits = b.seq.tokens, row
        for b, plans in zip(done, self.policy.children(done, iteration)):
            if not plans:
                self.engine.release(b.seq, publish=self.program.publish_leaves)
                b.seq = b.next_logits = None
                continue
            b.children_left = len(plans)
            self.holding.append(b)
            for plan in plans:
                if plan.start <= iteration:
                    raise ValueError(f"task {b.task}, node {plan.node}: starts at iteration "
                                     f"{plan.start}, not after its parent ends ({iteration})")
                self.pending.setdefault(plan.start, []).append((b, plan))

    def start_due(self, iteration):
        """Start the branches due at iteration (a zero-length one is done at once, so its
        children may be due at the same iteration: repeat until none is left)."""
        while self.pending.get(iteration):
            wave = self.pending.pop(iteration)
            by_parent = {}
            for parent, plan in wave:
                by_parent.setdefault(id(parent), (parent, []))[1].append(plan)
            children, rows = [], []
            for parent, plans in by_parent.values():
                # a parent with children still to start later keeps a sequence of its own
                keep = len(plans) < parent.children_left
                seqs = self.engine.fork(parent.seq, len(plans) + keep)
                parent.seq = seqs.pop() if keep else None
                parent.children_left -= len(plans)
                for plan, seq in zip(plans, seqs):
                    c = self._new(task=parent.task, node=plan.node, parent=parent,
                                  value=plan.value, start=plan.start, seq=seq,
                                  first_position=seq.kv_len, rows_from=seq.kv_len,
                                  path_logprob=parent.path_logprob,
                                  path_tokens=parent.path_tokens)
                    children.append(c)
                    rows.append(parent.next_logits)
                if not keep:
                    parent.next_logits = None
                    self.holding.remove(parent)
            tokens, logprobs = self.sample(torch.stack(rows))
            empty = []
            for c, tok, lp, row in zip(children, tokens, logprobs, rows):
                if c.value == 0:
                    empty.append((c, row))
                    continue
                c.seq.tokens.append(tok)
                c.path_logprob += lp
                c.path_tokens += 1
                self.generating.append(c)
            if empty:
                self.finish([c for c, _ in empty], [row for _, row in empty], iteration - 1)

    def sample(self, logits):
        """Sampled ids and (for a policy that scores) their log-probabilities, on the host:
        the children's first tokens (waves of any size, drawn eagerly; the compiled draw is
        the decode step's)."""
        _, fetch = self.sample_async(logits, race=exponential_race)
        return fetch()

    def sample_async(self, logits, race=None):
        """(ids, fetch): the sampled ids as a device tensor, queued with no host sync, and
        fetch(), which returns (ids, log-probabilities: zeros unless the policy scores) as host
        lists. Their copy to pinned host memory is queued here, so fetch() waits for the
        sampling only, not for work queued after it (the next step launched meanwhile)."""
        tokens = sample(logits, self.program.sampling, self.gen, race or self.engine.model.ops.race)
        lp = None
        if self.policy.needs_scores:
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
        n = len(tokens)
        if tokens.device.type != "cuda":
            return tokens, lambda: (tokens.tolist(), [0.0] * n if lp is None else lp.tolist())
        if self.host_tokens is None or len(self.host_tokens) < n:
            size = max(n, self.engine.max_batch)
            self.host_tokens = torch.empty(size, dtype=torch.long, pin_memory=True)
            self.host_lp = torch.empty(size, dtype=torch.float32, pin_memory=True)
            self.copied = torch.cuda.Event()
        host_tokens, host_lp = self.host_tokens[:n], self.host_lp[:n]
        host_tokens.copy_(tokens, non_blocking=True)
        if lp is not None:
            host_lp.copy_(lp, non_blocking=True)
        self.copied.record()

        def fetch():
            self.copied.synchronize()
            return host_tokens.tolist(), [0.0] * n if lp is None else host_lp.tolist()
        return tokens, fetch

    def release_all(self):
        """Release every sequence still held (also those of children a failed step had
        forked but not yet queued)."""
        for b in self.branches:
            if b.seq is not None:
                self.engine.release(b.seq, publish=False)
            b.seq = b.next_logits = None
        self.generating, self.holding, self.pending = [], [], {}


def run_tot(engine, program, seed=0, max_steps=None, record_logits=False, check_cache=False,
            time_attention=False, attention_every=1, on_step=None, overlap=True) -> ToTResult:
    """Prefill every task's prompt, then iterate: start the branches due, decode every
    generating branch in one step, sample, finish the branches that reached their length
    (the policy gives their children). Stops when no branch is left or after max_steps
    decode steps (the program's own max_steps too); every sequence is released at the end.

    overlap: when the next step decodes the same branches (none finishes, none starts), it
    is planned while this one runs and launched as soon as this one's sampling is queued,
    fed the sampled ids on the device; the host then reads this step's tokens (waiting for
    the sampling only) and does its bookkeeping while the GPU runs the next step. The tokens
    are the same either way (the same sampling calls in the same order). A step whose
    attention is timed neither launches the next one ahead (its timing replays its own plan)
    nor is launched ahead (its decode stays within its own step's time). Recording
    logits (tests) reads each step's rows with a sync, which waits for the step launched
    ahead too: do not time a run that records.

    A step's time runs from the end of the previous step's host work (or from its own start
    when nothing was launched ahead) to the end of its own, so the steps add up to the
    decode's wall time; the end-to-end time is the prefill's and the iterations'
    (instrumentation left out: the records, the attention timing of one step in
    attention_every, the cache checks)."""
    if program.max_steps is not None:
        max_steps = program.max_steps if max_steps is None else min(max_steps, program.max_steps)
    total_steps = program.num_steps if max_steps is None else min(program.num_steps, max_steps)
    run = _Run(engine, program, seed, record_logits, check_cache)
    graphs = getattr(engine, "graphs", None)
    if graphs is not None:
        for b in graphs.buckets:      # capture every batch shape outside the timed loop
            graphs.prepare(b)
    _sync(engine.device)
    started, instrumentation = time.perf_counter(), 0.0
    result = ToTResult(seqs=[], prefill_seconds=0.0, branches=run.branches)
    ahead = None    # (batch, logits, timed) of the step launched before this one's tokens were read
    try:
        run.prefill()
        run.note_pages()
        _sync(engine.device)
        result.prefill_seconds = time.perf_counter() - started
        iteration = 0
        step_started = None
        while run.generating or run.pending:
            if max_steps is not None and len(result.step_seconds) >= max_steps:
                break
            iteration += 1
            if ahead is not None:
                # launched by the last iteration: the same branches, nothing due now
                batch, logits, timed = ahead
                ahead = None
            else:
                if not run.generating and iteration not in run.pending:
                    iteration = min(run.pending)     # an idle gap in the schedule: skip it
                step_started = time.perf_counter()
                run.start_due(iteration)
                batch = list(run.generating)
                if not batch:
                    continue
                timed = time_attention and len(result.step_seconds) % attention_every == 0
                logits = engine.decode([b.seq for b in batch], time_attention=timed)
            seqs = [b.seq for b in batch]
            done = [b.generated + 1 == b.value for b in batch]
            last_step = max_steps is not None and len(result.step_seconds) + 1 >= max_steps
            same_next = not any(done) and iteration + 1 not in run.pending and not last_step
            if same_next:
                # the next step decodes the same sequences: plan it while this one runs
                engine.prepare(seqs)
            tokens, fetch = run.sample_async(logits)
            # a timed next step is not launched ahead: its work (all of it, where the device
            # runs synchronously) would fall in this step's time, its share past 1
            timed_next = time_attention and (len(result.step_seconds) + 1) % attention_every == 0
            if same_next and overlap and not timed and not timed_next:
                ahead = (batch, engine.decode(seqs, time_attention=False, ids=tokens), False)
            tokens, logprobs = fetch()
            for b, tok, lp, d in zip(batch, tokens, logprobs, done):
                b.generated += 1
                if not d:         # a done branch's sampled token would be a child's: dropped
                    b.seq.tokens.append(tok)
                    b.path_logprob += lp
                    b.path_tokens += 1
            if any(done):
                run.generating = [b for b, d in zip(batch, done) if not d]
                last = [i for i, d in enumerate(done) if d]
                # their logits rows, copied out of the step's [batch, vocab] logits
                run.finish([batch[i] for i in last], logits[last].unbind(0), iteration)
            measured = time.perf_counter()
            result.step_seconds.append(measured - step_started)
            result.batch_sizes.append(len(batch))
            # instrumentation, left out of the end-to-end time
            if run.record:
                for b, row in zip(batch, logits.float().cpu()):
                    b.logits.append(row)
            if timed:
                result.attention_steps.append(len(result.step_seconds) - 1)
                result.attention_seconds.append(engine.attention_seconds(len(batch)))
            run.note_pages()
            if on_step:
                on_step(len(result.step_seconds), total_steps)
            step_started = time.perf_counter()   # a step launched ahead counts from here
            instrumentation += step_started - measured
    finally:
        run.release_all()
    _sync(engine.device)
    result.end_to_end_seconds = time.perf_counter() - started - instrumentation
    run.note_pages()
    result.free_pages_min = run.free_min
    result.held_pages_peak = run.held_peak if run.evictable is not None else None
    return result
