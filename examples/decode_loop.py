"""A decode loop as a serving engine runs it, on treeattn.

A few-shot tree -- one 4000-token prompt shared by 32 branches -- decoded for
128 steps by a 32-layer attention-only stack with random weights (Llama-3-8B
attention shapes: 32 query heads, 8 KV heads, head_dim 128, hidden 4096, bf16).
Each step: one plan (the tree grew a token per branch), then one CUDA graph
replay of all 32 layers (RMS norm, QKV projection, the new token's K/V written into the
paged pool, treeattn attention, output projection, residual), captured once per
step shape and valid across re-plans. The attention alone is timed per step
with a second graph of the 32 layers' run() calls, for planner "auto" and
"per-query" (what vLLM/SGLang's paged decode does: shared pages read once per
query), and their ratio printed.

    python3 examples/decode_loop.py [--steps 128] [--prompt 4000] [--branches 32] [--json FILE]

Needs a CUDA GPU and treeattn built with CUDA (pip install . or
-DTREEATTN_PYTHON=ON with PYTHONPATH=<build>/python).
"""

import argparse
import json
import statistics
import sys
import time

import torch

import treeattn

H, HKV, D, HIDDEN, LAYERS, PAGE = 32, 8, 128, 4096, 32, 16


class PagedTree:
    """The prompt's pages and each branch's own pages; the arrays plan_tree takes."""

    def __init__(self, prompt, branches, num_pages, gen):
        pages = torch.randperm(num_pages).tolist()  # no executor may rely on contiguous pages
        self.prompt_len = prompt
        self.prompt_pages = [pages.pop() for _ in range((prompt + PAGE - 1) // PAGE)]
        if prompt % PAGE:
            raise ValueError("prompt: a multiple of the page size keeps branches page-aligned")
        self.branch_len = [0] * branches
        self.branch_pages = [[pages.pop() for _ in range((gen + PAGE - 1) // PAGE)] for _ in range(branches)]

    def new_token_rows(self):
        """Pool rows of each branch's next token (page * PAGE + slot)."""
        return [p[n // PAGE] * PAGE + n % PAGE for p, n in zip(self.branch_pages, self.branch_len)]

    def arrays(self):
        parents, num_tokens, offsets, page_ids = [-1], [self.prompt_len], [0], list(self.prompt_pages)
        offsets.append(len(page_ids))
        for pages, n in zip(self.branch_pages, self.branch_len):
            parents.append(0)
            num_tokens.append(n)
            page_ids += pages[:(n + PAGE - 1) // PAGE]
            offsets.append(len(page_ids))
        return dict(parents=parents, num_tokens=num_tokens, page_offsets=offsets, page_ids=page_ids,
                    query_nodes=list(range(1, len(parents))))


def event_ms(fn):
    """Milliseconds of one call of fn on the GPU (CUDA events)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def time_graph(graph, reps=20):
    """Median ms of graph replays, after a warm-up replay."""
    graph.replay()
    return statistics.median(event_ms(graph.replay) for _ in range(reps))


def run(planner, args):
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    B = args.branches
    num_pages = (args.prompt + B * (args.steps + PAGE)) // PAGE + 8
    tree = PagedTree(args.prompt, B, num_pages, args.steps + 1)
    # Pools: one layer-major tensor each, [layers, pages, page_size, Hkv, D]; a layer's pool is a view.
    k_cache = torch.randn(LAYERS, num_pages, PAGE, HKV, D, device=dev, dtype=dt)
    v_cache = torch.randn_like(k_cache)
    w_qkv = torch.randn(LAYERS, HIDDEN, (H + 2 * HKV) * D, device=dev, dtype=dt) / HIDDEN ** 0.5
    w_o = torch.randn(LAYERS, H * D, HIDDEN, device=dev, dtype=dt) / (H * D) ** 0.5
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, num_pages, dtype=dt, device=dev, max_queries=B,
                                  max_nodes=B + 1, max_page_refs=num_pages, planner=planner)
    # Static buffers of the captured step.
    x = torch.randn(B, HIDDEN, device=dev, dtype=dt)
    rows = torch.zeros(B, dtype=torch.long, device=dev)
    attn_out = torch.empty(LAYERS, B, H, D, device=dev, dtype=dt)
    q_all = torch.empty(LAYERS, B, H, D, device=dev, dtype=dt)

    def step_body(with_projections):
        for l in range(LAYERS):
            if with_projections:  # pre-norm, as in the model: K/V stay O(1) however x grows
                qkv = (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dt)) @ w_qkv[l]
                q = qkv[:, :H * D].view(B, H, D)  # strided: a view into the fused projection
                k_cache[l].view(-1, HKV, D)[rows] = qkv[:, H * D:(H + HKV) * D].view(B, HKV, D)
                v_cache[l].view(-1, HKV, D)[rows] = qkv[:, (H + HKV) * D:].view(B, HKV, D)
            else:
                q = q_all[l]
            attn.run(q, k_cache[l], v_cache[l], out=attn_out[l])
            if with_projections:
                x.add_(attn_out[l].view(B, H * D) @ w_o[l])

    def plan():
        rows.copy_(torch.tensor(tree.new_token_rows()))
        for i in range(B):
            tree.branch_len[i] += 1  # the new token is part of its branch's context
        attn.plan_tree(**tree.arrays())

    plan()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture (allocator, kernel attributes)
        step_body(True)
        step_body(False)
    torch.cuda.current_stream().wait_stream(s)
    # Record only the attention launches this plan uses (launch 0 is recorded anyway, last, as
    # the fallback of plans that need it): the tree keeps its shape, so later plans use the same
    # ones; a plan that needed another would still run correctly on these graphs (on a larger
    # tile), only slower.
    if args.graph_launches == "plan":
        attn.graph_launches = attn.plan_launches
    step_graph, attn_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(step_graph):
        step_body(True)
    with torch.cuda.graph(attn_graph):
        step_body(False)

    step_ms, attn_ms, plan_us, other_launches = [], [], [], 0
    for step in range(args.steps):
        if step:
            t0 = time.perf_counter()
            plan()
            plan_us.append((time.perf_counter() - t0) * 1e6)
            other_launches += attn.plan_launches != attn.graph_launches
        step_ms.append(event_ms(step_graph.replay))
        q_all.normal_()
        attn_ms.append(time_graph(attn_graph, reps=5))
        if step % 32 == 0 or step == args.steps - 1:
            print(f"  {planner:9s} step {step:4d}: context {args.prompt}+{tree.branch_len[0]:<4d} "
                  f"step {step_ms[-1]:.3f} ms, attention {attn_ms[-1]:.3f} ms (32 layers)", flush=True)
    assert torch.isfinite(x).all(), "the decode loop produced non-finite activations"
    print(f"  {planner:9s} graphs of launches {attn.graph_launches:#x} ({attn.describe()}); "
          f"plans that used other launches: {other_launches} of {args.steps - 1}", flush=True)
    return dict(planner=planner, graph_launches=attn.graph_launches, plans_with_other_launches=other_launches, step_ms_median=statistics.median(step_ms),
                attention_ms_median=statistics.median(attn_ms), attention_ms=attn_ms,
                plan_us_median=statistics.median(plan_us) if plan_us else 0.0, summary=attn.plan_summary())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--prompt", type=int, default=4000)
    p.add_argument("--branches", type=int, default=32)
    p.add_argument("--graph-launches", choices=("plan", "all"), default="plan",
                   help="attention launches the graphs record: the first plan's (default) or all")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if not torch.cuda.is_available() or not treeattn.cuda_built:
        sys.exit("decode_loop.py: needs a CUDA GPU and a CUDA build of treeattn")
    print(f"{torch.cuda.get_device_name()}: prompt {args.prompt}, {args.branches} branches, {args.steps} steps, "
          f"{LAYERS} layers, heads {H}/{HKV}, d {D}, bf16, page {PAGE}, graphs of {args.graph_launches} launches")
    results = [run(planner, args) for planner in ("auto", "per-query")]
    auto, pq = results
    print("\n| planner | step ms (median) | attention ms / step (median) | plan us (median) |")
    print("|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['planner']} | {r['step_ms_median']:.3f} | {r['attention_ms_median']:.3f} | {r['plan_us_median']:.0f} |")
    ratio = pq["attention_ms_median"] / auto["attention_ms_median"]
    print(f"\nattention per step: per-query / auto = {ratio:.2f}x; whole step: "
          f"{pq['step_ms_median'] / auto['step_ms_median']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), args=vars(args), results=results,
                           attention_ratio=ratio), f, indent=1)


if __name__ == "__main__":
    main()
