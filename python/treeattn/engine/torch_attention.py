"""TorchTreeAttention: the pure-PyTorch reference backend with treeattn.TreeAttention's API.
plan_tree / plan_tree_queries / plan_block_tables turn the batch into each query's context rows; run() does
per-query softmax attention in fp32 over the gathered K/V rows. Simple, obviously correct,
slow: for tests and for checking the real backend."""
import math

import numpy as np
import torch


def _int_array(name, a):
    a = np.asarray(a.cpu() if isinstance(a, torch.Tensor) else a)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D int32 array, got shape {a.shape}")
    return a.astype(np.int64)


class TorchTreeAttention:
    # TreeAttention's CUDA-graph launch masks: this backend has no fixed launches, so one
    # graph serves every plan (the engine's GraphRunner keys its graphs on plan_launches)
    graph_launches = 0
    plan_launches = 0

    def __init__(self, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages,
                 dtype="bf16", device="cpu", max_queries=None, max_nodes=None,
                 max_page_refs=None, planner="torch-ref"):
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads: {num_qo_heads} is not a multiple of "
                             f"num_kv_heads {num_kv_heads}")
        self.hq, self.hkv, self.d = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.num_pages = page_size, num_pages
        self.device = torch.device(device)
        self.max_queries, self.max_nodes, self.max_page_refs = max_queries, max_nodes, max_page_refs
        self.rows = []   # per query: LongTensor of its context rows, root first

    def _check_capacity(self, name, value, limit):
        if limit is not None and value > limit:
            raise ValueError(f"{name}: {value} exceeds the capacity {limit} fixed at construction")

    def plan_tree(self, parents, num_tokens, page_offsets, page_ids, query_nodes):
        path_rows = self._tree(parents, num_tokens, page_offsets, page_ids, query_nodes, 0)
        self.rows = [path_rows(q, node) for q, node in enumerate(self._queries)]

    def plan_tree_queries(self, parents, num_tokens, page_offsets, page_ids, query_nodes,
                          draft_nodes, draft_parents, draft_rows):
        """Queries: query_nodes, then draft i: one token at pool row draft_rows[i] under
        draft draft_parents[i] (an earlier one) or, when that is -1, tree node draft_nodes[i]."""
        nodes = _int_array("draft_nodes", draft_nodes)
        dparents = _int_array("draft_parents", draft_parents)
        drows = _int_array("draft_rows", draft_rows)
        k = len(nodes)
        if len(dparents) != k or len(drows) != k:
            raise ValueError(f"draft_nodes, draft_parents and draft_rows differ in length "
                             f"({k}, {len(dparents)}, {len(drows)})")
        path_rows = self._tree(parents, num_tokens, page_offsets, page_ids, query_nodes, k)
        rows = [path_rows(q, node) for q, node in enumerate(self._queries)]
        for i in range(k):
            if not -1 <= dparents[i] < i:
                raise ValueError(f"draft {i}: draft_parents = {dparents[i]} must be -1 or an "
                                 f"earlier draft (< {i})")
            if not 0 <= drows[i] < self.num_pages * self.page_size:
                raise ValueError(f"draft {i}: draft_rows = {drows[i]} is out of range")
            base = rows[len(self._queries) + dparents[i]] if dparents[i] >= 0 else \
                path_rows(f"draft_nodes[{i}]", nodes[i])
            rows.append(torch.cat([base, torch.tensor([drows[i]], device=self.device)]))
        self.rows = rows

    def _tree(self, parents, num_tokens, page_offsets, page_ids, query_nodes, num_drafts):
        """Checks a tree and its queries (plus num_drafts more against max_queries); keeps the
        queries in self._queries; returns path_rows(what, node): the rows root..node."""
        parents, num_tokens = _int_array("parents", parents), _int_array("num_tokens", num_tokens)
        offsets, pages = _int_array("page_offsets", page_offsets), _int_array("page_ids", page_ids)
        self._queries = _int_array("query_nodes", query_nodes)
        n = len(parents)
        if len(num_tokens) != n or len(offsets) != n + 1:
            raise ValueError(f"num_tokens/page_offsets: expected {n} / {n + 1} entries for "
                             f"{n} nodes, got {len(num_tokens)} / {len(offsets)}")
        self._check_capacity("query_nodes", len(self._queries) + num_drafts, self.max_queries)
        self._check_capacity("parents", n + num_drafts, self.max_nodes)
        self._check_capacity("page_ids", len(pages) + num_drafts, self.max_page_refs)
        node_rows = [self._node_rows(i, num_tokens, offsets, pages) for i in range(n)]

        def path_rows(what, node):
            if not 0 <= node < n:
                label = f"query_nodes[{what}]" if isinstance(what, int) else what
                raise ValueError(f"{label}: node {node} out of range [0, {n})")
            path = []
            while node >= 0:   # walk to the root; a forest of depth <= n
                path.append(node_rows[node])
                node = parents[node]
                if len(path) > n:
                    raise ValueError(f"parents: cycle through node {node}")
            return torch.from_numpy(np.concatenate(path[::-1])).to(self.device)
        return path_rows

    def _node_rows(self, i, num_tokens, offsets, pages):
        ps, t = self.page_size, num_tokens[i]
        own = pages[offsets[i]:offsets[i + 1]]
        # a node's pages are all full except possibly the last one
        if len(own) != -(-t // ps):
            raise ValueError(f"num_tokens[{i}]: {t} tokens need {-(-t // ps)} pages of "
                             f"{ps}, node has {len(own)}")
        if len(own) and (own.min() < 0 or own.max() >= self.num_pages):
            raise ValueError(f"page_ids of node {i}: outside [0, {self.num_pages})")
        return (own[:, None] * ps + np.arange(ps)[None, :]).reshape(-1)[:t]

    def plan_block_tables(self, block_tables, seq_lens):
        tables = np.asarray(block_tables.cpu() if isinstance(block_tables, torch.Tensor)
                            else block_tables).astype(np.int64)
        lens = _int_array("seq_lens", seq_lens)
        if tables.ndim != 2 or tables.shape[0] != len(lens):
            raise ValueError(f"block_tables: expected [{len(lens)}, W], got {tables.shape}")
        self._check_capacity("seq_lens", len(lens), self.max_queries)
        ps = self.page_size
        self.rows = []
        for b, n in enumerate(lens):
            if n > tables.shape[1] * ps:
                raise ValueError(f"seq_lens[{b}]: {n} tokens exceed {tables.shape[1]} pages")
            idx = np.arange(n)
            rows = tables[b, idx // ps] * ps + idx % ps
            self.rows.append(torch.from_numpy(rows).to(self.device))

    def run(self, q, k_pool, v_pool, out=None, return_lse=False, scale=None):
        """q [Q, Hq, D]; pools [num_pages, page_size, Hkv, D] -> out [Q, Hq, D] (+ lse [Q, Hq])."""
        if q.ndim != 3 or q.shape[0] != len(self.rows) or q.shape[1:] != (self.hq, self.d):
            raise ValueError(f"q: expected [{len(self.rows)}, {self.hq}, {self.d}], "
                             f"got {list(q.shape)}")
        scale = 1.0 / math.sqrt(self.d) if scale is None else scale
        k_rows = k_pool.reshape(-1, self.hkv, self.d)
        v_rows = v_pool.reshape(-1, self.hkv, self.d)
        group = self.hq // self.hkv
        o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float32, device=q.device)
        for i, rows in enumerate(self.rows):
            if len(rows) == 0:   # an empty context yields zeros, never NaN
                continue
            k = k_rows[rows].float().repeat_interleave(group, dim=1)   # [L, Hq, D]
            v = v_rows[rows].float().repeat_interleave(group, dim=1)
            s = torch.einsum("hd,lhd->hl", q[i].float(), k) * scale
            lse[i] = torch.logsumexp(s, dim=-1)
            o[i] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
        if out is None:
            out = torch.empty_like(q)
        out.copy_(o)
        return (out, lse) if return_lse else out
