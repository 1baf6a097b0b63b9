"""A vLLM-style decode loop on treeattn: block tables in, shared prefixes found.

A vLLM-style engine knows its batch as a block table (the page ids of each
sequence, row by row) and the sequences' lengths; it does not keep a tree.
Here a few prompts are each sampled several ways (parallel sampling: the
samples' rows start with their prompt's pages), the batch decodes a token a
step, samples fork (the child shares its parent's full pages and copies the
partial last one to a page of its own, as copy-on-write does) and finish
(their pages go back to the pool). Each step: ``plan_block_tables`` (treeattn
finds the shared prefixes from equal leading page ids; a step that only grew
the sequences grows the last tree and extends the last plan), then ``run``
for the step's queries. Every ``--check`` steps the output is compared with a
plain per-sequence softmax over each sequence's own K/V rows.

    python3 examples/block_tables.py [--device cpu|cuda] [--steps 64] [--prompts 4] [--samples 4]

Prints per step the planning time, the tree's nodes, and the error when
checked; at the end how the steps were planned (fresh or extended) and the
largest error. Runs on the CPU executor when no GPU is present.
"""

import argparse
import random
import sys
import time

import torch

import treeattn

H, HKV, D, PAGE = 8, 2, 64, 16


class Batch:
    """The engine's side: sequences as block-table rows over a pool of pages."""

    def __init__(self, prompts, samples, prompt_len, num_pages, rng):
        self.free = list(range(num_pages))
        rng.shuffle(self.free)  # pages in no particular order, as a pool hands them out
        self.rows, self.lens = [], []
        for _ in range(prompts):
            prompt_pages = [self.free.pop() for _ in range(prompt_len // PAGE)]  # whole pages: shared
            for _ in range(samples):
                self.rows.append(list(prompt_pages))
                self.lens.append(len(prompt_pages) * PAGE)
        self.refs = {}  # page -> sequences holding it (shared prompt pages are freed by the last one)
        for row in self.rows:
            for pg in row:
                self.refs[pg] = self.refs.get(pg, 0) + 1

    def grow(self, s):
        """Sequence s takes one more token (a page from the pool when its last is full)."""
        if self.lens[s] % PAGE == 0:
            pg = self.free.pop()
            self.rows[s].append(pg)
            self.refs[pg] = 1
        self.lens[s] += 1

    def fork(self, s, k_pool, v_pool):
        """A child of sequence s: its full pages shared, its partial last page copied."""
        row = list(self.rows[s])
        if self.lens[s] % PAGE:
            pg = self.free.pop()
            k_pool[pg], v_pool[pg] = k_pool[row[-1]], v_pool[row[-1]]
            row[-1] = pg
        for pg in row:
            self.refs[pg] = self.refs.get(pg, 0) + 1
        self.rows.insert(s + 1, row)
        self.lens.insert(s + 1, self.lens[s])

    def finish(self, s):
        for pg in self.rows.pop(s):
            self.refs[pg] -= 1
            if self.refs[pg] == 0:
                del self.refs[pg]
                self.free.append(pg)
        self.lens.pop(s)

    def table(self):
        """The block table [batch, width] (int32, -1 past each row's pages) and the lengths."""
        width = max(len(r) for r in self.rows)
        t = torch.full((len(self.rows), width), -1, dtype=torch.int32)
        for s, row in enumerate(self.rows):
            t[s, :len(row)] = torch.tensor(row, dtype=torch.int32)
        return t, torch.tensor(self.lens, dtype=torch.int32)


def reference(q, k_pool, v_pool, rows, lens):
    """Each sequence's attention over its own rows, in fp32, one at a time."""
    out = torch.empty(q.shape, dtype=torch.float32)
    g = H // HKV
    for s, (row, n) in enumerate(zip(rows, lens)):
        pages = torch.tensor(row, dtype=torch.long)
        k = k_pool[pages].float().reshape(-1, HKV, D)[:n]  # [n, HKV, D]
        v = v_pool[pages].float().reshape(-1, HKV, D)[:n]
        for h in range(H):
            w = torch.softmax(k[:, h // g] @ q[s, h].float() / D ** 0.5, dim=0)
            out[s, h] = w @ v[:, h // g]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() and treeattn.cuda_built else "cpu")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4, help="sequences per prompt at the start")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--check", type=int, default=8, help="compare with the reference every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.prompt_len % PAGE:
        ap.error(f"--prompt-len: a multiple of the page size {PAGE}, got {a.prompt_len}")
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    max_seqs = a.prompts * a.samples * 2
    num_pages = a.prompts * a.prompt_len // PAGE + max_seqs * (a.steps // PAGE + 2)
    k_pool = torch.randn(num_pages, PAGE, HKV, D, dtype=torch.float16).to(a.device)
    v_pool = torch.randn(num_pages, PAGE, HKV, D, dtype=torch.float16).to(a.device)
    batch = Batch(a.prompts, a.samples, a.prompt_len, num_pages, rng)
    attn = treeattn.TreeAttention(H, HKV, D, PAGE, num_pages, dtype=torch.float16, device=a.device,
                                  max_queries=max_seqs, max_nodes=4 * max_seqs, max_page_refs=num_pages)
    worst = 0.0
    for step in range(a.steps):
        # The engine's step: a fork or a finish now and then, then every sequence a token longer.
        event = rng.random()
        if event < 0.05 and len(batch.rows) < max_seqs:
            batch.fork(rng.randrange(len(batch.rows)), k_pool, v_pool)
        elif event < 0.08 and len(batch.rows) > 1:
            batch.finish(rng.randrange(len(batch.rows)))
        for s in range(len(batch.rows)):
            batch.grow(s)
        table, lens = batch.table()
        t0 = time.perf_counter()
        attn.plan_block_tables(table.numpy(), lens.numpy())
        plan_us = (time.perf_counter() - t0) * 1e6
        q = torch.randn(len(batch.rows), H, D, dtype=torch.float16)
        out = attn.run(q.to(a.device), k_pool, v_pool).float().cpu()
        line = f"step {step:3d}: {len(batch.rows):3d} sequences, {attn.plan_summary()['units']:4d} units, plan {plan_us:7.1f} us"
        if step % a.check == 0 or step == a.steps - 1:
            ref = reference(q, k_pool.cpu(), v_pool.cpu(), batch.rows, batch.lens)
            err = ((out - ref).norm() / ref.norm()).item()
            worst = max(worst, err)
            line += f", rel. error {err:.2e}"
        if not a.quiet:
            print(line)
    stats = attn.plan_stats()
    print(f"{a.steps} steps on {a.device}: {stats['planned']} planned afresh, {stats['extended']} extended; "
          f"largest relative error {worst:.2e} (fp16)")
    return stats, worst


if __name__ == "__main__":
    _, worst = main()
    sys.exit(0 if worst < 2e-3 else 1)
