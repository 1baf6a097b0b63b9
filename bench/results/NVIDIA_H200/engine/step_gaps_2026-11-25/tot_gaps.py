"""Where a ToT replay step's time goes on the GPU: per decode step, the graph's GPU time and
the GPU time between one graph's end and the next one's start (sampling, forks, plan
uploads, and the GPU waiting for the host), split by whether the step was prepared ahead."""
import os, sys, time, statistics, json
import torch
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "engine"))
import tot_bench
from engine_bench import warm_up
from treeattn.engine import load_model
from treeattn.engine import graphs as G
from treeattn.engine import engine as E
from treeattn.engine.ops import choose_ops
from treeattn.engine.tot import make_tot_program, run_tot

file, steps, attention = sys.argv[1], int(sys.argv[2]), sys.argv[3]
overlap = len(sys.argv) < 5 or sys.argv[4] != "no-overlap"
import treeattn.engine.tot as T
spent = {}
def timed(cls, name, label=None):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            key = label or name
            t0, c0 = spent.get(key, (0.0, 0))
            spent[key] = (t0 + time.perf_counter() - t, c0 + 1)
    setattr(cls, name, w)
import treeattn.engine.kv as KV
timed(KV.KVPool, "copy_rows")
for cls, name in ((T._Run, "start_due"), (T._Run, "finish"), (T._Run, "sample"), (E.Engine, "_plan"),
                  (E.Engine, "fork"), (E.Engine, "release"), (E.Engine, "prepare"), (E.Engine, "decode"),
                  (E.Engine, "_forest"), (T._Run, "sample_async"), (E.Engine, "publish"), (E.Engine, "_rows"),
                  (E.Engine, "_alloc"), (E.Engine, "_invalidate")):
    timed(cls, name)
args = tot_bench.parse_args(["--files", file, "--max-steps", str(steps)])
dev = torch.device("cuda")
model = load_model(args.model, device=dev, dtype=args.dtype, seed=args.seed)
model.use_ops(choose_ops(args.compile, dev))
warm_up(model, args)
spec = tot_bench.spec_of(os.path.join(tot_bench.WORKLOADS, file), args)
tot_bench.warm_up_file(model, spec, args)
rec, prepared = [], []
orig_replay, orig_prepared = G.GraphRunner.replay, E.Engine._prepared
def replay(self, b, ids=None):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); out = orig_replay(self, b, ids); e.record()
    rec.append((s, e, b)); return out
def was_prepared(self, seqs):
    r = orig_prepared(self, seqs); prepared.append(r); return r
G.GraphRunner.replay, E.Engine._prepared = replay, was_prepared
samp = []
orig_sa = T._Run.sample_async
def sa(self, logits):
    s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s0.record(); out = orig_sa(self, logits); e0.record(); samp.append((s0, e0, len(logits))); return out
T._Run.sample_async = sa
program = make_tot_program(spec, model.cfg.vocab_size, seed=args.seed)
with tot_bench.sized_engine(model, program, attention, args) as engine:
    res = run_tot(engine, program, seed=args.seed, max_steps=steps, overlap=overlap)
torch.cuda.synchronize()
n = len(res.step_seconds)
rec = rec[-n:]; prepared = prepared[-n:]
graph = [s.elapsed_time(e) for s, e, _ in rec]
gap = [rec[i][1].elapsed_time(rec[i + 1][0]) for i in range(n - 1)] + [float("nan")]
wall = [1e3 * x for x in res.step_seconds]
def summ(idx, name):
    if not idx: return
    m = lambda xs: statistics.mean(xs[i] for i in idx if xs[i] == xs[i])
    print(f"{name:>14}: {len(idx):5d} steps  wall {m(wall):7.2f} ms  graph {m(graph):7.2f} ms  "
          f"gap to next graph {m(gap):6.2f} ms  batch {statistics.mean(res.batch_sizes[i] for i in idx):.0f}")
import treeattn.engine.kv as KV
big = [a.elapsed_time(b) for a, b, n in samp if n > 100]
print(f"sampling GPU ms (batches > 100): mean {statistics.mean(big):.3f} over {len(big)}")
print("host seconds per call site (whole run): " + ", ".join(f"{k} {v[0]:.3f}/{v[1]}" for k, v in sorted(spent.items())))
print(f"{file} / {attention} (overlap {overlap}), {n} steps, prefill {res.prefill_seconds:.2f} s, end-to-end {res.end_to_end_seconds:.2f} s")
summ(list(range(n)), "all")
summ([i for i in range(n) if prepared[i]], "prepared ahead")
summ([i for i in range(n) if not prepared[i]], "planned in step")
