"""Speculative decoding on treeattn: verifying draft token trees, two ways.

Requests share a system prompt and each has its own context after it (a radix
tree: the prompt is the root, each request's context a child). Each step every
request brings a draft token tree (a Medusa-style tree: a few candidates for
the next token, a few for the one after each; parents listed first), and the
target model scores all drafts in one pass: draft i's query attends to its
request's path, its draft ancestors and itself. An engine can do that in two
ways, both shown here for every layer-step and checked against a plain softmax
over each query's own rows:

  A. drafts in the pool: their K/V written to pool rows first, then one
     ``plan_tree_queries`` (the tree plus the drafts as one-token nodes) and
     one ``run``;
  B. drafts outside the pool: ``plan_tree`` with each draft's query on its
     request's node and ``run(..., return_lse=True)`` for the prefix part, a
     small dense attention over the drafts' own K/V under the tree mask for
     the rest, and the two merged by the log-sum-exp rule (how an engine adds
     attention the pool does not hold, e.g. the step's fresh K/V before it is
     written).

After a step each request accepts a random root-to-leaf prefix of its draft
tree: the accepted tokens' K/V are appended to its context pages, and the
draft rows go back to the pool.

    python3 examples/speculative_verify.py [--device cpu|cuda] [--steps 8] [--requests 4]

Prints per step the drafts, both ways' planning time and their errors against
the reference; exits non-zero if an error is over the fp16 tolerance (2e-3).
Runs on the CPU executor when no GPU is present.
"""

import argparse
import random
import sys
import time

import torch

import treeattn

H, HKV, D, PAGE = 8, 2, 64, 16
TOLERANCE = 2e-3  # relative L2 error of fp16 attention against fp32 (DESIGN.md)


def draft_tree(rng, widths):
    """Parents of a draft tree, parents first: widths[0] candidates for the next
    token, then widths[d] children under each draft of depth d - 1."""
    parents, level = [], [-1]
    for w in widths:
        nxt = []
        for p in level:
            for _ in range(rng.randint(1, w)):
                parents.append(p)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


class Pool:
    """The engine's KV pool: pages handed out and returned; row = page * PAGE + slot."""

    def __init__(self, num_pages, device, rng):
        self.k = torch.randn(num_pages, PAGE, HKV, D, dtype=torch.float16, device=device)
        self.v = torch.randn_like(self.k)
        self.free = list(range(num_pages))
        rng.shuffle(self.free)

    def take(self):
        return self.free.pop()


class Request:
    """A request's context after the shared prompt: its tokens in its own pages."""

    def __init__(self, pool, tokens):
        self.pages, self.tokens = [], 0
        self.append_fresh(pool, tokens)

    def append_fresh(self, pool, n):  # n new tokens with fresh K/V (already in the pool's random values)
        for _ in range(n):
            if self.tokens % PAGE == 0:
                self.pages.append(pool.take())
            self.tokens += 1

    def append_rows(self, pool, k_rows, v_rows):  # accepted drafts: their K/V copied into place
        for kr, vr in zip(k_rows, v_rows):
            if self.tokens % PAGE == 0:
                self.pages.append(pool.take())
            pg, slot = self.pages[-1], self.tokens % PAGE
            pool.k[pg, slot], pool.v[pg, slot] = kr, vr
            self.tokens += 1

    def rows(self):
        return [self.pages[t // PAGE] * PAGE + t % PAGE for t in range(self.tokens)]


def tree_arrays(prompt_pages, prompt_tokens, requests):
    """The prefix tree as arrays: node 0 the shared prompt, node 1 + r request r's context."""
    parents, tokens, offsets, pages = [-1], [prompt_tokens], [0, len(prompt_pages)], list(prompt_pages)
    for r in requests:
        parents.append(0)
        tokens.append(r.tokens)
        pages += r.pages
        offsets.append(len(pages))
    return dict(parents=parents, num_tokens=tokens, page_offsets=offsets, page_ids=pages)


def reference(q, k_flat, v_flat, rows_per_query):
    """Each query's softmax over its own rows, in fp32."""
    out = torch.empty(q.shape, dtype=torch.float32)
    g = H // HKV
    for i, rows in enumerate(rows_per_query):
        idx = torch.tensor(rows, dtype=torch.long)
        k, v = k_flat[idx].float(), v_flat[idx].float()  # [n, HKV, D]
        for h in range(H):
            w = torch.softmax(k[:, h // g] @ q[i, h].float() / D ** 0.5, dim=0)
            out[i, h] = w @ v[:, h // g]
    return out


def tree_masked_attention(q, k, v, allowed):
    """Dense attention of the drafts over the drafts' own K/V ([n, HKV, D]) under
    the mask allowed[i, j] (j is i or an ancestor of i); returns out and the lse
    ([n, H], natural log), in fp32."""
    g = H // HKV
    kk = k.float().repeat_interleave(g, dim=1)  # [n, H, D]
    vv = v.float().repeat_interleave(g, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.float(), kk) / D ** 0.5  # [H, n, n]
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, n]
    out = torch.einsum("hij,jhd->ihd", torch.exp(s - lse[..., None]), vv)
    return out, lse.t()


def merge(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two parts from each part's attention and lse."""
    m = torch.maximum(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - m)[..., None], torch.exp(lse_b - m)[..., None]
    return (wa * out_a + wb * out_b) / (wa + wb)


def rel_err(out, ref):
    return ((out.float().cpu() - ref).norm() / ref.norm()).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() and treeattn.cuda_built else "cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1024, help="the shared system prompt's tokens")
    ap.add_argument("--context-len", type=int, default=300, help="each request's own tokens at the start")
    ap.add_argument("--widths", default="3,2,2", help="draft candidates per level (Medusa-style heads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    widths = [int(w) for w in a.widths.split(",")]
    max_drafts = 1
    for level in range(len(widths)):
        count = 1
        for w in widths[:level + 1]:
            count *= w
        max_drafts += count
    max_queries = a.requests * max_drafts
    num_pages = (a.prompt_len // PAGE + 1 + a.requests * ((a.context_len + a.steps * len(widths)) // PAGE + 2)
                 + max_queries)
    pool = Pool(num_pages, a.device, rng)
    prompt_pages = [pool.take() for _ in range((a.prompt_len + PAGE - 1) // PAGE)]
    requests = [Request(pool, a.context_len) for _ in range(a.requests)]
    common = dict(dtype=torch.float16, device=a.device, max_queries=max_queries,
                  max_nodes=1 + a.requests + max_queries, max_page_refs=num_pages)
    with_drafts = treeattn.TreeAttention(H, HKV, D, PAGE, num_pages, **common)  # way A
    prefix_only = treeattn.TreeAttention(H, HKV, D, PAGE, num_pages, **common)  # way B
    worst = 0.0
    for step in range(a.steps):
        tree = tree_arrays(prompt_pages, a.prompt_len, requests)
        # The drafts of every request, parents first: request r's drafts under node 1 + r.
        draft_nodes, draft_parents, owner, local = [], [], [], []
        for r in range(a.requests):
            base = len(draft_parents)
            for i, p in enumerate(draft_tree(rng, widths)):
                draft_nodes.append(1 + r)
                draft_parents.append(base + p if p >= 0 else -1)
                owner.append(r)
                local.append(i)
        n = len(draft_parents)
        q = torch.randn(n, H, D, dtype=torch.float16, device=a.device)
        k_new = torch.randn(n, HKV, D, dtype=torch.float16, device=a.device)  # the drafts' K/V, from this pass
        v_new = torch.randn_like(k_new)
        ancestors = []  # draft i's draft ancestors, root first, and itself
        for i in range(n):
            chain, j = [], i
            while j >= 0:
                chain.append(j)
                j = draft_parents[j]
            ancestors.append(chain[::-1])

        # A: the drafts' K/V written to pool rows, then the tree plus the drafts planned as one.
        rows = [pool.take() * PAGE for _ in range(n)]  # a page each here; an engine packs them
        k_flat, v_flat = pool.k.view(-1, HKV, D), pool.v.view(-1, HKV, D)
        k_flat[torch.tensor(rows, device=a.device)] = k_new
        v_flat[torch.tensor(rows, device=a.device)] = v_new
        t0 = time.perf_counter()
        with_drafts.plan_tree_queries(**tree, query_nodes=[], draft_nodes=draft_nodes, draft_parents=draft_parents,
                                      draft_rows=rows)
        plan_a = (time.perf_counter() - t0) * 1e6
        out_a = with_drafts.run(q, pool.k, pool.v)

        # B: the prefix from the pool with its lse, the drafts' own part dense, merged.
        t0 = time.perf_counter()
        prefix_only.plan_tree(**tree, query_nodes=[1 + r for r in owner])
        plan_b = (time.perf_counter() - t0) * 1e6
        out_p, lse_p = prefix_only.run(q, pool.k, pool.v, return_lse=True)
        allowed = torch.zeros(n, n, dtype=torch.bool, device=a.device)
        for i in range(n):
            allowed[i, ancestors[i]] = True
        out_d, lse_d = tree_masked_attention(q, k_new, v_new, allowed)
        out_b = merge(out_p.float(), lse_p, out_d, lse_d)

        prompt_rows = [prompt_pages[t // PAGE] * PAGE + t % PAGE for t in range(a.prompt_len)]
        ref_rows = [prompt_rows + requests[owner[i]].rows() + [rows[j] for j in ancestors[i]] for i in range(n)]
        ref = reference(q.cpu(), k_flat.cpu(), v_flat.cpu(), ref_rows)
        err_a, err_b = rel_err(out_a, ref), rel_err(out_b, ref)
        worst = max(worst, err_a, err_b)
        if not a.quiet:
            print(f"step {step}: {n:3d} drafts of {a.requests} requests; A (drafts in the pool) plan "
                  f"{plan_a:7.1f} us, rel. error {err_a:.2e}; B (prefix + lse merge) plan {plan_b:7.1f} us, "
                  f"rel. error {err_b:.2e}")

        # Each request accepts a random root-to-leaf prefix of its drafts; their K/V move into place.
        for r, req in enumerate(requests):
            mine = [i for i in range(n) if owner[i] == r]
            leaf = rng.choice(mine)
            accepted = ancestors[leaf][:rng.randint(0, len(ancestors[leaf]))]
            req.append_rows(pool, k_new[accepted], v_new[accepted])
            req.append_fresh(pool, 1)  # the token the target model samples after them
        pool.free += [row // PAGE for row in rows]
    print(f"{a.steps} steps on {a.device}: largest relative error {worst:.2e} (fp16; tolerance {TOLERANCE})")
    return worst


if __name__ == "__main__":
    sys.exit(0 if main() < TOLERANCE else 1)
