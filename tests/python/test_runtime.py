"""treeattn.TreeAttention on the CPU (NumPy arrays and CPU torch tensors) and,
when a GPU is present, on CUDA: every way to plan against an fp64 reference,
strided pools, lse, every bad argument's error, and CUDA-graph replays that
survive re-planning."""

import re
import warnings

import numpy as np
import pytest

import treeattn

torch = pytest.importorskip("torch")
HAVE_GPU = torch.cuda.is_available() and treeattn.cuda_built


def random_tree(rng, nodes, queries, page_size, max_tokens=40):
    """A random forest with pages handed out without reuse; queries on random nodes."""
    parents, num_tokens, page_ids, offsets = [], [], [], [0]
    next_page = 0
    for v in range(nodes):
        parents.append(-1 if v == 0 else int(rng.integers(-1 if v < 3 else 0, v)))
        t = int(rng.integers(0 if v else 1, max_tokens))
        num_tokens.append(t)
        n = (t + page_size - 1) // page_size
        page_ids.extend(range(next_page, next_page + n))
        next_page += n
        offsets.append(len(page_ids))
    perm = rng.permutation(max(next_page, 1))
    page_ids = [int(perm[p]) for p in page_ids]
    query_nodes = [int(rng.integers(0, nodes)) for _ in range(queries)]
    return dict(parents=parents, num_tokens=num_tokens, page_offsets=offsets, page_ids=page_ids,
                query_nodes=query_nodes), max(next_page, 1)


def token_rows(tree, node, page_size, first_slots=None):
    """Pool rows of the path root..node, root first."""
    path = []
    while node >= 0:
        path.append(node)
        node = tree["parents"][node]
    rows = []
    for v in reversed(path):
        pages = tree["page_ids"][tree["page_offsets"][v]:tree["page_offsets"][v + 1]]
        fs = 0 if first_slots is None else first_slots[v]
        rows += [pages[(fs + t) // page_size] * page_size + (fs + t) % page_size for t in range(tree["num_tokens"][v])]
    return rows


def reference(q, k, v, rows_per_query, scale=None):
    """fp64 softmax attention of each query over its rows; also the lse."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    Q, H, D = q.shape
    Hkv = k.shape[-2]
    kf, vf = k.reshape(-1, Hkv, D), v.reshape(-1, Hkv, D)
    scale = scale or 1.0 / np.sqrt(D)
    out, lse = np.zeros((Q, H, D)), np.full((Q, H), -np.inf)
    for i, rows in enumerate(rows_per_query):
        if not rows:
            continue
        for h in range(H):
            s = kf[rows, h // (H // Hkv)] @ q[i, h] * scale
            m = s.max()
            p = np.exp(s - m)
            out[i, h] = p @ vf[rows, h // (H // Hkv)] / p.sum()
            lse[i, h] = m + np.log(p.sum())
    return out, lse


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


@pytest.mark.parametrize("planner", ["auto", "node", "per-query", "flatten", "fasttree"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_plan_tree_numpy_matches_reference(planner, heads):
    rng = np.random.default_rng(1)
    ps, D = 4, 64
    tree, pages = random_tree(rng, 12, 9, ps)
    attn = treeattn.TreeAttention(heads[0], heads[1], D, ps, pages, dtype="fp16", device="cpu", planner=planner,
                                  max_queries=16, max_nodes=32, max_page_refs=256)
    attn.plan_tree(**tree)
    q = rng.uniform(-1, 1, (9, heads[0], D)).astype(np.float16)
    k = rng.uniform(-1, 1, (pages, ps, heads[1], D)).astype(np.float16)
    v = rng.uniform(-1, 1, (pages, ps, heads[1], D)).astype(np.float16)
    out, lse = attn.run(q, k, v, return_lse=True)
    ref, ref_lse = reference(q, k, v, [token_rows(tree, n, ps) for n in tree["query_nodes"]])
    assert rel_err(out, ref) < 2e-3
    finite = np.isfinite(ref_lse)
    assert np.allclose(lse[finite], ref_lse[finite], atol=1e-3)
    assert attn.plan_summary()["queries"] == 9


def test_decode_steps_extend_the_plan_and_match_the_reference():
    """A tree whose query nodes grow a token a step: plan_tree extends the last plan (plan_stats counts it) until
    a unit outgrows max_extension_tokens, and every step matches the reference; with 0 every step is planned."""
    rng = np.random.default_rng(5)
    ps, H, Hkv, D, steps = 4, 4, 2, 64, 24
    tree = dict(parents=[-1, 0, 0, 0, 1, 1], num_tokens=[30, 9, 5, 7, 3, 6], query_nodes=[2, 3, 4, 5, 5])
    pool = 200
    free = list(rng.permutation(pool))
    pages = [[int(free.pop()) for _ in range((t + ps - 1) // ps)] for t in tree["num_tokens"]]
    k = rng.uniform(-1, 1, (pool, ps, Hkv, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (pool, ps, Hkv, D)).astype(np.float16)
    for limit in (8, 0):
        attn = treeattn.TreeAttention(H, Hkv, D, ps, pool, dtype="fp16", device="cpu", max_queries=8, max_nodes=8,
                                      max_page_refs=pool, max_extension_tokens=limit)
        t = dict(tree, num_tokens=list(tree["num_tokens"]))
        pg = [list(p) for p in pages]
        spare = list(free)
        for step in range(steps):
            t["page_ids"] = [p for node in pg for p in node]
            t["page_offsets"] = list(np.cumsum([0] + [len(node) for node in pg]))
            attn.plan_tree(**{name: np.asarray(a, dtype=np.int32) for name, a in t.items()})
            q = rng.uniform(-1, 1, (5, H, D)).astype(np.float16)
            ref, _ = reference(q, k, v, [token_rows(t, n, ps) for n in t["query_nodes"]])
            assert rel_err(attn.run(q, k, v), ref) < 2e-3, (limit, step)
            for n in set(t["query_nodes"]):  # a decode step: each query's node one token longer
                t["num_tokens"][n] += 1
                if t["num_tokens"][n] > len(pg[n]) * ps:
                    pg[n].append(int(spare.pop()))
        stats = attn.plan_stats()
        assert stats["planned"] + stats["extended"] == steps
        if limit:  # node 5 holds two queries, so a unit gains up to 2 tokens a step: a fresh plan every few steps
            assert stats["extended"] >= steps // 2 and stats["planned"] >= 3, stats
        else:
            # Each fresh plan after the first checks only the grown nodes' pages.
            assert stats == {"planned": steps, "extended": 0, "pages_rechecked": steps - 1}
    with pytest.raises(ValueError, match="max_extension_tokens = -1"):
        treeattn.TreeAttention(H, Hkv, D, ps, pool, device="cpu", max_extension_tokens=-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_cpu_strided_layer_major_pools(dtype):
    """Pools as views into a [layers, 2, num_pages, page_size, Hkv, D] cache and q sliced from a fused QKV."""
    rng = np.random.default_rng(2)
    ps, H, Hkv, D = 8, 8, 2, 64
    tree, pages = random_tree(rng, 10, 6, ps, max_tokens=30)
    cache = torch.randn(3, 2, pages, ps, Hkv, D, dtype=dtype)
    qkv = torch.randn(6, (H + 2 * Hkv) * D, dtype=dtype)
    q = qkv[:, :H * D].view(6, H, D)  # query stride (H + 2 Hkv) D
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype=dtype, device="cpu", max_queries=8, max_nodes=16,
                                  max_page_refs=128)
    attn.plan_tree(**{k: torch.tensor(v) for k, v in tree.items()})
    rows = [token_rows(tree, n, ps) for n in tree["query_nodes"]]
    for layer in range(3):
        k, v = cache[layer, 0], cache[layer, 1]
        out = attn.run(q, k, v)
        ref, _ = reference(q.float().numpy(), k.float().numpy(), v.float().numpy(), rows)
        assert rel_err(out.float().numpy(), ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)


def fp8_pools(rng, shape, scale):
    """A torch.float8_e4m3fn pool quantised as vLLM stores one (value / scale), and what it stands for (float64)."""
    x = torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32))
    stored = (x / scale).to(torch.float8_e4m3fn)
    return stored, stored.double() * scale


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("planner", ["auto", "node", "per-query"])
def test_fp8_kv_pools_match_the_reference_on_the_dequantised_values(dtype, planner):
    """fp8 K/V pools (torch.float8_e4m3fn, or NumPy uint8 holding the same bytes) with per-tensor scales: the output
    equals the fp64 attention over stored value x scale within the dtype's bound, lse included; the scales reach
    the kernel (a run with the scales left at 1 differs)."""
    rng = np.random.default_rng(11)
    ps, H, Hkv, D = 4, 8, 2, 64
    tree, pages = random_tree(rng, 14, 10, ps)
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype=dtype, kv_dtype=torch.float8_e4m3fn, device="cpu",
                                  planner=planner, max_queries=16, max_nodes=32, max_page_refs=256)
    assert attn.kv_dtype == "fp8_e4m3"
    attn.plan_tree(**tree)
    k8, kd = fp8_pools(rng, (pages, ps, Hkv, D), 0.3)
    v8, vd = fp8_pools(rng, (pages, ps, Hkv, D), 1.7)
    q = torch.from_numpy(rng.uniform(-1, 1, (10, H, D)).astype(np.float32)).to(dtype)
    out, lse = attn.run(q, k8, v8, return_lse=True, k_scale=0.3, v_scale=1.7)
    ref, ref_lse = reference(q.double().numpy(), kd.numpy(), vd.numpy(),
                             [token_rows(tree, n, ps) for n in tree["query_nodes"]])
    assert rel_err(out.double().numpy(), ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)
    finite = np.isfinite(ref_lse)
    assert np.allclose(lse.numpy()[finite], ref_lse[finite], atol=1e-3)
    as_bytes = attn.run(q, k8.view(torch.uint8).numpy(), v8.view(torch.uint8).numpy(), torch.empty_like(q),
                        k_scale=0.3, v_scale=1.7)
    assert torch.equal(as_bytes, out)
    unscaled = attn.run(q, k8, v8)
    assert rel_err(unscaled.double().numpy(), ref) > 0.1


def test_fp8_kv_bad_arguments_name_the_argument():
    rng = np.random.default_rng(12)
    ps, H, Hkv, D = 4, 4, 2, 64
    tree, pages = random_tree(rng, 6, 3, ps)
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, kv_dtype="fp8_e4m3", device="cpu", max_queries=4,
                                  max_nodes=8, max_page_refs=64)
    attn.plan_tree(**tree)
    q = torch.zeros(3, H, D, dtype=torch.float16)
    k8 = torch.zeros(pages, ps, Hkv, D, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="k_pool: expected dtype float8_e4m3fn .* got float16"):
        attn.run(q, k8.half(), k8)
    with pytest.raises(TypeError, match="q: expected dtype float16"):
        attn.run(k8[:3, 0], k8, k8)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="k_scale: expected a positive finite number"):
            attn.run(q, k8, k8, k_scale=bad)
    with pytest.raises(ValueError, match="v_scale: expected a positive finite number"):
        attn.run(q, k8, k8, v_scale=0)
    with pytest.raises(TypeError, match="v_scale: expected a number"):
        attn.run(q, k8, k8, v_scale="x")
    fp16 = treeattn.TreeAttention(H, Hkv, D, ps, pages, device="cpu", max_queries=4, max_nodes=8, max_page_refs=64)
    fp16.plan_tree(**tree)
    with pytest.raises(TypeError, match="v_pool: expected dtype float16 .* got float8_e4m3fn"):
        fp16.run(q, k8.half(), k8)
    with pytest.raises(TypeError, match="kv_dtype: expected None, the dtype \\(fp16\\) or fp8_e4m3"):
        treeattn.TreeAttention(H, Hkv, D, ps, pages, kv_dtype="bf16", device="cpu")


def test_block_tables_find_the_shared_prefix():
    rng = np.random.default_rng(3)
    ps, H, Hkv, D = 4, 4, 4, 64
    shared = [5, 9, 2]  # 12 tokens shared by every sequence
    tables = [shared + [10 + i, 20 + i] for i in range(4)]
    lens = [12 + 3 + i for i in range(4)]
    attn = treeattn.TreeAttention(H, Hkv, D, ps, 32, device="cpu", planner="node", max_queries=8)
    attn.plan_block_tables(np.array(tables, dtype=np.int32), lens)
    s = attn.plan_summary()
    assert s["unique_kv_bytes"] == (12 + sum(l - 12 for l in lens)) * Hkv * D * 2 * 2
    assert s["kv_ratio"] == pytest.approx(1.0)  # node loads the shared pages once
    q = rng.uniform(-1, 1, (4, H, D)).astype(np.float16)
    k = rng.uniform(-1, 1, (32, ps, Hkv, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (32, ps, Hkv, D)).astype(np.float16)
    rows = [[t[i // ps] * ps + i % ps for i in range(l)] for t, l in zip(tables, lens)]
    assert rel_err(attn.run(q, k, v), reference(q, k, v, rows)[0]) < 2e-3


def test_tree_queries_attend_to_prefix_and_draft_ancestors():
    """A request's prefix (two nodes) and a 5-token draft tree written right after it in its last page."""
    rng = np.random.default_rng(4)
    ps, H, Hkv, D = 8, 4, 2, 64
    tree = dict(parents=[-1, 0], num_tokens=[16, 3], page_offsets=[0, 2, 3], page_ids=[4, 1, 6], query_nodes=[1])
    # drafts: 0 <- prefix, 1 <- 0, 2 <- 0, 3 <- 1, 4 <- prefix ; KV rows after the 3 tail tokens in page 6, then page 2
    draft_rows = [6 * ps + 3, 6 * ps + 4, 6 * ps + 5, 6 * ps + 6, 6 * ps + 7]
    draft_parents = [-1, 0, 0, 1, -1]
    draft_nodes = [1, 1, 1, 1, 1]
    attn = treeattn.TreeAttention(H, Hkv, D, ps, 8, device="cpu", max_queries=8, max_nodes=16)
    attn.plan_tree_queries(**tree, draft_nodes=draft_nodes, draft_parents=draft_parents, draft_rows=draft_rows)
    assert attn.num_queries == 6
    prefix = token_rows(tree, 1, ps)
    chains = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [4]}
    rows = [prefix] + [prefix + [draft_rows[j] for j in chains[i]] for i in range(5)]
    q = rng.uniform(-1, 1, (6, H, D)).astype(np.float16)
    k = rng.uniform(-1, 1, (8, ps, Hkv, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (8, ps, Hkv, D)).astype(np.float16)
    assert rel_err(attn.run(q, k, v), reference(q, k, v, rows)[0]) < 2e-3


def make_small():
    attn = treeattn.TreeAttention(4, 2, 64, 4, 16, device="cpu", max_queries=4, max_nodes=8, max_page_refs=16)
    tree = dict(parents=[-1, 0], num_tokens=[8, 2], page_offsets=[0, 2, 3], page_ids=[0, 1, 2], query_nodes=[1, 1])
    return attn, tree


def test_bad_plans_name_the_field():
    attn, tree = make_small()
    cases = [
        (dict(parents=[-1, 5]), "parent"),
        (dict(num_tokens=[8]), "num_tokens"),
        (dict(page_offsets=[0, 2]), "page_offsets"),
        (dict(page_ids=[0, 1, 99]), "page id 99"),
        (dict(page_ids=[0, 1, 1]), "page id 1"),
        (dict(num_tokens=[8, 9]), "pages"),
        (dict(query_nodes=[7]), "query"),
        (dict(query_nodes=[1] * 5), "queries = 5 exceeds the capacity 4"),
        (dict(parents=[1, 0]), "cycle"),
    ]
    for change, words in cases:
        with pytest.raises(ValueError, match=words):
            attn.plan_tree(**{**tree, **change})
    with pytest.raises(TypeError, match="page_ids"):
        attn.plan_tree(**{**tree, "page_ids": [0.5, 1.0, 2.0]})
    with pytest.raises(ValueError, match="first_slots: 0 entries for 2 nodes"):
        attn.plan_tree(**tree, first_slots=[])
    with pytest.raises(ValueError, match="draft_parents"):
        attn.plan_tree_queries(**tree, draft_nodes=[1], draft_parents=[3], draft_rows=[13])
    with pytest.raises(ValueError, match="draft_rows"):
        attn.plan_tree_queries(**tree, draft_nodes=[1], draft_parents=[-1], draft_rows=[10_000])
    with pytest.raises(ValueError, match="slots"):  # a draft in a slot the tree already uses
        attn.plan_tree_queries(**tree, draft_nodes=[1], draft_parents=[-1], draft_rows=[9])


EXTREMES = [-2**31, -2, -1, 0, 1, 2**31 - 1, 2**31, 2**40, -2**63]


def mutate(rng, arrays):
    """One random change to one of `arrays` (a dict of int lists): an entry set to a
    random or extreme value, an entry dropped or added, or the array passed as
    another dtype, shape or layout. Returns the changed dict and what changed."""
    key = str(rng.choice(sorted(arrays)))
    a = list(arrays[key])
    kind = int(rng.integers(0, 8))
    if kind <= 2 and a:  # an entry changed
        i = int(rng.integers(0, len(a)))
        a[i] = int(rng.choice(EXTREMES)) if kind == 0 else a[i] + int(rng.integers(-3, 4))
        value = a
    elif kind == 3 and a:
        value = a[:-1]
    elif kind == 4:
        value = a + [int(rng.integers(-1, 40))]
    elif kind == 5:
        value = np.array(a, dtype=np.int64).astype([np.int64, np.int16, np.float32, np.uint32][int(rng.integers(0, 4))])
    elif kind == 6:  # every other entry of an array twice as long: a strided view
        value = np.repeat(np.array(a, dtype=np.int32), 2)[::2]
    else:
        value = np.array(a, dtype=np.int32).reshape(1, -1) if a else np.zeros((0, 2), np.int32)
    return {**arrays, key: value}, f"{key}: kind {kind}"


def test_random_argument_mutations_plan_correctly_or_raise():
    """Valid trees, block tables and draft trees with one argument changed at random:
    each plan call either raises ValueError or TypeError and keeps the plan in force
    (a run still matches the last accepted plan's reference), or plans what the
    arrays say (a run matches their reference). No other exception, no crash."""
    rng = np.random.default_rng(11)
    ps, H, Hkv, D = 4, 4, 2, 64
    pages = 64
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype="fp16", device="cpu", max_queries=12, max_nodes=24,
                                  max_page_refs=128)
    k = rng.uniform(-1, 1, (pages, ps, Hkv, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (pages, ps, Hkv, D)).astype(np.float16)
    raised, accepted = [0, 0, 0], [0, 0, 0]  # per way to plan
    rows_in_force = None

    def check(rows):
        q = rng.uniform(-1, 1, (len(rows), H, D)).astype(np.float16)
        assert rel_err(attn.run(q, k, v), reference(q, k, v, rows)[0]) < 2e-3

    for trial in range(3000):
        way = trial % 3
        tree, _ = random_tree(rng, int(rng.integers(1, 10)), int(rng.integers(1, 8)), ps, max_tokens=20)
        if way == 0:
            first_slots = [0] * len(tree["parents"]) if trial % 2 else None  # mutated into partial first pages
            args, what = mutate(rng, {**tree, "first_slots": first_slots} if first_slots else tree)
            call = lambda a: attn.plan_tree(**a)  # noqa: E731
        elif way == 1:
            nseq = int(rng.integers(1, 6))
            perm = [int(x) for x in rng.permutation(pages)]
            tables = [perm[:3] + perm[3 + 2 * i: 5 + 2 * i] for i in range(nseq)]
            lens = [int(rng.integers(3 * ps + 1, 5 * ps + 1)) for _ in range(nseq)]  # the shared pages full
            args, what = mutate(rng, dict(block_tables=[x for t in tables for x in t], seq_lens=lens))
            call = lambda a: attn.plan_block_tables(  # noqa: E731
                np.asarray(a["block_tables"]).reshape(nseq, -1) if np.asarray(a["block_tables"]).size % nseq == 0
                else np.asarray(a["block_tables"]), a["seq_lens"])
        else:
            drafts = int(rng.integers(1, 4))
            draft = dict(draft_nodes=[tree["query_nodes"][0]] * drafts,
                         draft_parents=[int(rng.integers(-1, j)) for j in range(drafts)],
                         draft_rows=[pages * ps - 1 - j for j in range(drafts)])
            args, what = mutate(rng, {**tree, **draft})
            call = lambda a: attn.plan_tree_queries(**a)  # noqa: E731
        try:
            call(args)
        except (ValueError, TypeError):
            raised[way] += 1
            if rows_in_force is not None:
                check(rows_in_force)  # the plan in force is the last accepted one
            continue
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"trial {trial} ({what}): {type(e).__name__}: {e}")
        accepted[way] += 1
        # Accepted: the arrays as passed describe a valid step; its rows from them.
        a = {key: [int(x) for x in np.asarray(val).reshape(-1)] for key, val in args.items()}
        if way == 1:
            width = len(a["block_tables"]) // len(a["seq_lens"])
            rows_in_force = [[a["block_tables"][s * width + i // ps] * ps + i % ps for i in range(n)]
                             for s, n in enumerate(a["seq_lens"])]
        else:
            rows_in_force = [token_rows(a, n, ps, a.get("first_slots")) for n in a["query_nodes"]]
            if way == 2:
                chain = []
                for j, p in enumerate(a["draft_parents"]):
                    chain.append((chain[p] if p >= 0 else token_rows(a, a["draft_nodes"][j], ps)) + [a["draft_rows"][j]])
                rows_in_force += chain
        assert attn.num_queries == len(rows_in_force), what
        check(rows_in_force)
    assert min(raised) > 100 and min(accepted) > 100, (raised, accepted)


def layout_variant(rng, x):
    """x (a NumPy array) as another layout of the same values, or a wrong one:
    another dtype, two axes swapped (a transposed view), a strided view into a
    larger array, one axis reversed (negative strides), a dimension added or
    lost, no rows, read-only, Fortran order, or a CPU torch tensor of a view.
    Returns the variant and its name."""
    kind = int(rng.integers(0, 10))
    ax = int(rng.integers(0, x.ndim))
    if kind == 0:
        dt = [np.float32, np.float64, np.int16, np.float16][int(rng.integers(0, 4))]
        with np.errstate(invalid="ignore"):  # NaN-filled outputs as integers
            return x.astype(dt), f"dtype {np.dtype(dt).name}"
    if kind == 1:
        ax2 = int(rng.integers(0, x.ndim))
        return np.swapaxes(x, ax, ax2), f"axes {ax}, {ax2} swapped"
    if kind == 2:  # the same values every other entry of axis ax of a larger array
        big = np.repeat(x, 2, axis=ax)
        return big[(slice(None),) * ax + (slice(None, None, 2),)], f"strided along axis {ax}"
    if kind == 3:
        return np.flip(x, axis=ax), f"axis {ax} reversed"
    if kind == 4:
        return x[None], "a dimension added"
    if kind == 5:
        return x[0], "a dimension lost"
    if kind == 6:
        return x[:0], "no rows"
    if kind == 7:
        y = x.copy()
        y.setflags(write=False)
        return y, "read-only"
    if kind == 8:
        return np.asfortranarray(x), "Fortran order"
    big = np.repeat(x, 2, axis=ax)
    return torch.from_numpy(big[(slice(None),) * ax + (slice(None, None, 2),)]), f"torch, strided along axis {ax}"


def test_random_run_argument_layouts_run_correctly_or_raise():
    """run() with one of q, k_pool, v_pool, out, lse in another layout (or a
    wrong one): ValueError or TypeError, out and lse untouched; or attention
    of the values given, written where the arrays say. No other exception,
    no crash."""
    rng = np.random.default_rng(12)
    ps, H, Hkv, D, pages = 4, 4, 2, 64, 16
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, device="cpu", max_queries=8, max_nodes=8, max_page_refs=32)
    tree = dict(parents=[-1, 0, 0], num_tokens=[9, 3, 6], page_offsets=[0, 3, 4, 6], page_ids=[7, 2, 11, 4, 9, 13],
                query_nodes=[1, 2, 2])
    attn.plan_tree(**tree)
    rows = [token_rows(tree, n, ps) for n in tree["query_nodes"]]
    raised, ran = 0, 0

    def values(x):
        return np.array(x.numpy() if isinstance(x, torch.Tensor) else x)

    for trial in range(600):
        args = dict(q=rng.uniform(-1, 1, (3, H, D)).astype(np.float16),
                    k_pool=rng.uniform(-1, 1, (pages, ps, Hkv, D)).astype(np.float16),
                    v_pool=rng.uniform(-1, 1, (pages, ps, Hkv, D)).astype(np.float16),
                    out=np.full((3, H, D), np.nan, np.float16), lse=np.full((3, H), np.nan, np.float32))
        key = str(rng.choice(sorted(args)))
        args[key], what = layout_variant(rng, args[key])
        given = {k: values(v) for k, v in args.items()}  # the values, before the call
        try:
            attn.run(args["q"], args["k_pool"], args["v_pool"], args["out"], lse=args["lse"])
        except (ValueError, TypeError):
            raised += 1
            for name in ("out", "lse"):  # nothing written
                assert np.array_equal(values(args[name]), given[name], equal_nan=True), (trial, what, name)
            continue
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"trial {trial} ({key}: {what}): {type(e).__name__}: {e}")
        ran += 1
        ref, ref_lse = reference(given["q"], given["k_pool"], given["v_pool"], rows)
        assert rel_err(values(args["out"]), ref) < 2e-3, (trial, key, what)
        assert np.allclose(values(args["lse"]), ref_lse, atol=1e-3), (trial, key, what)
    assert raised > 100 and ran > 30, (raised, ran)


def test_bad_run_arguments_name_the_argument():
    attn, tree = make_small()
    rng = np.random.default_rng(5)
    q = rng.uniform(-1, 1, (2, 4, 64)).astype(np.float16)
    k = rng.uniform(-1, 1, (16, 4, 2, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="nothing planned"):
        attn.run(q, k, k)
    attn.plan_tree(**tree)
    with pytest.raises(TypeError, match="q: expected dtype float16"):
        attn.run(q.astype(np.float32), k, k)
    with pytest.raises(ValueError, match="q: 3 queries"):
        attn.run(np.zeros((3, 4, 64), np.float16), k, k)
    with pytest.raises(ValueError, match=r"k_pool: shape \[8, 4, 2, 64\]"):
        attn.run(q, k[:8], k[:8])
    with pytest.raises(ValueError, match="q: shape"):
        attn.run(q[:, :2], k, k)
    with pytest.raises(ValueError, match="dense"):
        attn.run(q[:, :, ::2].repeat(2, axis=2)[:, :, ::1][:, ::-1], k, k)
    with pytest.raises(ValueError, match="out: must not overlap q's memory"):
        attn.run(q, k, k, out=q)
    # Overlaps short of the same pointer: views of one buffer.
    buf = np.zeros((4, 4, 64), np.float16)
    buf[:2] = q
    with pytest.raises(ValueError, match="out: must not overlap q's memory"):
        attn.run(buf[:2], k, k, out=buf[1:3])
    with pytest.raises(ValueError, match="out: must not overlap q's memory"):
        attn.run(buf[:2], k, k, out=buf[:2][::-1])  # negative strides: the same bytes
    v = k.copy()
    with pytest.raises(ValueError, match="out: must not overlap v_pool's memory"):
        attn.run(q, k, v, out=v.reshape(-1)[512:1024].reshape(2, 4, 64))  # a view into the pool
    out = np.zeros((2, 4, 64), np.float16)
    with pytest.raises(ValueError, match="lse: must not overlap out's memory"):
        attn.run(q, k, k, out=out, lse=out.view(np.float32).reshape(-1)[:8].reshape(2, 4))
    assert np.array_equal(attn.run(buf[:2], k, k, out=buf[2:]), attn.run(q, k, k))  # adjacent, not overlapping
    # A NumPy array's dtype is named as NumPy names it.
    with pytest.raises(TypeError, match="lse: expected dtype float32, got float64"):
        attn.run(q, k, k, lse=np.zeros((2, 4)))
    with pytest.raises(TypeError, match="out: expected dtype float16 .*, got int16"):
        attn.run(q, k, k, out=np.zeros((2, 4, 64), np.int16))
    read_only = q.copy()
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match="out: a read-only array"):
        attn.run(q, k, k, out=read_only)
    k_read_only = k.copy()
    k_read_only.setflags(write=False)  # inputs are only read: taken as they are
    assert np.array_equal(attn.run(read_only, k_read_only, k_read_only), attn.run(q, k, k))
    # Byte strides that are not a multiple of the item size: NumPy's DLPack export refuses them; its reason is named.
    odd = np.ndarray((2, 4, 64), np.float16, buffer=np.zeros(1026, np.uint8), offset=1, strides=(513, 128, 2))
    with pytest.raises(ValueError, match=r"q: its DLPack export failed \(DLPack only supports strides"):
        attn.run(odd, k, k)
    for device in ("tpu", "cpu:0", "cuda:x", "cuda:-1", "cuda:"):
        with pytest.raises(ValueError, match="device: expected 'cpu', 'cuda' or 'cuda:<index>', got '" + device):
            treeattn.TreeAttention(4, 2, 64, 4, 16, device=device)
    assert treeattn.TreeAttention(4, 2, 64, 4, 16, device=torch.device("cpu")).device_index == -1
    with pytest.raises(TypeError, match="dtype"):
        treeattn.TreeAttention(4, 2, 64, 4, 16, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="max_queries"):
        treeattn.TreeAttention(4, 2, 64, 4, 16, device="cpu", max_queries=0)
    with pytest.raises(ValueError, match="planner"):
        treeattn.TreeAttention(4, 2, 64, 4, 16, device="cpu", planner="nope")
    # every listed planner is one the constructor takes; the default comes first
    names = [name for name, _ in treeattn.planners()]
    assert names[0] == "auto" and {"per-query", "node"} <= set(names)
    for name in names:
        treeattn.TreeAttention(4, 2, 64, 4, 16, device="cpu", planner=name)


def test_a_failed_plan_keeps_the_previous_one():
    attn, tree = make_small()
    attn.plan_tree(**tree)
    with pytest.raises(ValueError):
        attn.plan_tree(**{**tree, "page_ids": [0, 1, 99]})
    assert attn.num_queries == 2


# ---- GPU ------------------------------------------------------------------------

def torch_reference(q, k, v, rows_per_query):
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    H, Hkv = q.shape[1], k.shape[-2]
    kf, vf = k.reshape(-1, Hkv, k.shape[-1]).float(), v.reshape(-1, Hkv, v.shape[-1]).float()
    for i, rows in enumerate(rows_per_query):
        idx = torch.tensor(rows, device=q.device)
        kk = kf[idx].repeat_interleave(H // Hkv, dim=1)  # [T, H, D]
        vv = vf[idx].repeat_interleave(H // Hkv, dim=1)
        s = torch.einsum("hd,thd->ht", q[i].float(), kk) / q.shape[-1] ** 0.5
        out[i] = torch.einsum("ht,thd->hd", s.softmax(-1), vv)
    return out


def test_l2_persistent_plan_is_accepted_and_ignored_on_the_cpu():
    rng = np.random.default_rng(8)
    tree, pages = random_tree(rng, 12, 6, 4)
    q = rng.standard_normal((6, 4, 64)).astype(np.float16)
    k = rng.standard_normal((pages, 4, 2, 64)).astype(np.float16)
    v = rng.standard_normal((pages, 4, 2, 64)).astype(np.float16)
    outs = []
    for l2 in (False, True):
        attn = treeattn.TreeAttention(4, 2, 64, 4, pages, device="cpu", l2_persistent_plan=l2)
        attn.plan_tree(**tree)
        outs.append(attn.run(q, k, v))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_plan_options_reach_the_planner_and_bad_ones_name_the_key():
    # One 600-token shared prefix under 8 leaves: node splits the prefix into
    # pieces of split_tokens where it is given; every plan matches the reference.
    rng = np.random.default_rng(11)
    page_size, leaves = 4, 8
    num_tokens = [600] + [int(rng.integers(1, 9)) for _ in range(leaves)]
    pages_of = [(t + page_size - 1) // page_size for t in num_tokens]
    offsets = np.concatenate([[0], np.cumsum(pages_of)]).tolist()
    pages = offsets[-1]
    tree = dict(parents=[-1] + [0] * leaves, num_tokens=num_tokens, page_offsets=offsets,
                page_ids=rng.permutation(pages).tolist(), query_nodes=list(range(1, leaves + 1)))
    q = rng.standard_normal((leaves, 4, 64)).astype(np.float16)
    k = rng.standard_normal((pages, page_size, 2, 64)).astype(np.float16)
    v = rng.standard_normal((pages, page_size, 2, 64)).astype(np.float16)
    ref, _ = reference(q, k, v, [token_rows(tree, n, page_size) for n in tree["query_nodes"]])
    units = {}
    for options in (None, {"split_tokens": 128}, {"split_tokens": 128, "ctas_per_sm": 1}):
        attn = treeattn.TreeAttention(4, 2, 64, page_size, pages, device="cpu", planner="node", plan_options=options)
        attn.plan_tree(**tree)
        assert rel_err(attn.run(q, k, v), ref) < 2e-3, options
        units[str(options)] = attn.plan_summary()["units"]
    # The prefix in 5 pieces of 120 tokens instead of node's 3 of 200 (min_split_tokens 256), beside the 8 leaves.
    assert units[str({"split_tokens": 128})] == units["None"] + 2 == 13, units
    bad = [({"tile_row": 64}, ValueError, "unknown key 'tile_row'"),
           ({"ctas_per_sm": 100}, ValueError, "ctas_per_sm = 100"),
           ({"min_split_tokens": 0.5}, ValueError, "min_split_tokens = 0.5"),
           ({"split_tokens": "128"}, TypeError, "plan_options['split_tokens']"),
           ({"split_tokens": True}, TypeError, "plan_options['split_tokens']"),
           ({7: 1}, TypeError, "plan_options: keys"),
           # A knob out of its planner's range fails here, not at the first plan (and for any planner).
           ({"tile_rows": -1}, ValueError, "tile_rows = -1 must be an integer in [1, 128]"),
           ({"split_tokens": -5}, ValueError, "split_tokens = -5 must be an integer in [0, 1000000000]"),
           ({"pack_tokens": 2 ** 30}, ValueError, "pack_tokens = 1073741824 must be an integer in [0, 1000000000]"),
           ({"q_tile0": 1000}, ValueError, "q_tile0 = 1000 must be a number in [1, 128]"),
           ({"kv_split_long": 0.5}, ValueError, "kv_split_long = 0.5 must be an integer")]
    for options, error, text in bad:
        with pytest.raises(error, match=re.escape(text)):
            treeattn.TreeAttention(4, 2, 64, page_size, pages, device="cpu", plan_options=options)


def test_constructor_and_plan_arguments_name_themselves():
    """Arguments past their C++ type, of the wrong type, or of a meaning the
    runtime would change silently: an error naming the argument and the value
    (found by an adversarial probe of the API; nanobind's own conversion error
    names neither)."""
    def make(**kw):
        args = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, num_pages=16, device="cpu")
        args.update(kw)
        return treeattn.TreeAttention(**args)

    cases = [(dict(num_qo_heads=2 ** 31), ValueError, "num_qo_heads = 2147483648 is out of range"),
             (dict(head_dim=1.5), TypeError, "head_dim: expected an int, got 1.5"),
             (dict(num_kv_heads=True), TypeError, "num_kv_heads: expected an int, got True"),
             (dict(max_nodes=None), TypeError, "max_nodes: expected an int, got None"),
             (dict(num_pages=2 ** 64), ValueError, "num_pages = 18446744073709551616 is out of range"),
             (dict(num_sms=0), ValueError, "num_sms = 0 is out of range [1, "),
             (dict(cpu_threads=-1), ValueError, "cpu_threads = -1 is out of range [0, 1024]"),
             (dict(cpu_threads=100000), ValueError, "cpu_threads = 100000 is out of range [0, 1024]")]
    for kw, error, text in cases:
        with pytest.raises(error, match=re.escape(text)):
            make(**kw)
    attn, tree = make_small()
    for stream, error, text in [(-1, ValueError, "stream: expected a stream handle (an int in [0, 2**64)), got -1"),
                                (2 ** 64, ValueError, "got 18446744073709551616"),
                                ("abc", TypeError, "stream: expected a stream handle (an int), got 'abc'")]:
        with pytest.raises(error, match=re.escape(text)):
            attn.plan_tree(**tree, stream=stream)
    with pytest.raises(ValueError, match="block_tables: a meta tensor holds no values"):
        attn.plan_block_tables(torch.zeros(2, 3, dtype=torch.int32, device="meta"), [5, 5])
    # A draft on a row a tree node holds: the check names the draft's node and says which draft it is.
    with pytest.raises(ValueError, match=re.escape("nodes 2 .. 2 are the drafts: node 2 + i is draft i")):
        attn.plan_tree_queries(**tree, draft_nodes=[1], draft_parents=[-1], draft_rows=[9])
    with pytest.raises(TypeError, match=re.escape("page_size: expected an int, got float")):
        treeattn.RadixCache(10, 1.5)
    with pytest.raises(ValueError, match=re.escape("page_size = 2147483648 is out of range")):
        treeattn.RadixCache(10, 2 ** 31)
    with pytest.raises(TypeError, match=re.escape("tokens[0]: expected an int, got float")):
        treeattn.RadixCache(10, 2).match_prefix([1.5])


def test_radix_cache_refuses_a_bool_for_an_int():
    """A bool where RadixCache takes an int (a node handle, a count, a token or page id) is
    a TypeError naming the argument, as the constructor's: nanobind's own int conversion
    took it (lock(True) locked node 1, alloc(True) handed out a page, match_prefix([True])
    matched token 1). NumPy integers are still ints; a wrong int is a ValueError naming it;
    a refused call changes nothing."""
    c = treeattn.RadixCache(8, 2)
    node = c.insert([5, 6, 7, 8], c.alloc(2))
    free, cached = c.num_free_pages(), c.num_cached_pages()
    for call, text in [(lambda: c.lock(True), "node: expected an int, got bool"),
                       (lambda: c.unlock(False), "node: expected an int, got bool"),
                       (lambda: c.lock(np.bool_(True)), "node: expected an int, got bool"),
                       (lambda: c.lock("1"), "node: expected an int, got str"),
                       (lambda: c.alloc(True), "n: expected an int, got bool"),
                       (lambda: c.alloc(1.0), "n: expected an int, got float"),
                       (lambda: c.evict(True), "num_pages: expected an int, got bool"),
                       (lambda: c.match_prefix([5, True]), "tokens[1]: expected an int, got bool"),
                       (lambda: c.insert([True, 6], [0]), "tokens[0]: expected an int, got bool"),
                       (lambda: c.free([True]), "pages[0]: expected an int, got bool"),
                       (lambda: c.export_tree([False]), "nodes[0]: expected an int, got bool")]:
        with pytest.raises(TypeError, match=re.escape(text)):
            call()
    with pytest.raises(ValueError, match=re.escape("node = 4294967296 is out of range [-2147483648, 2147483647]")):
        c.lock(2 ** 32)
    c.check()
    assert (c.num_free_pages(), c.num_cached_pages()) == (free, cached)
    c.lock(np.int32(node))                      # NumPy integers are ints
    c.unlock(np.int64(node))
    assert len(c.alloc(np.int64(1))) == 1
    assert c.evict(np.int16(0)) == 0
    c.check()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
def test_gpu_l2_persistent_plan_changes_no_bit_of_the_output():
    rng = np.random.default_rng(9)
    ps, D = 16, 128
    tree, pages = random_tree(rng, 40, 48, ps, max_tokens=300)
    k = torch.randn(pages, ps, 8, D, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(48, 32, D, dtype=torch.float16, device="cuda")
    outs = []
    for l2 in (False, True):
        attn = treeattn.TreeAttention(32, 8, D, ps, pages, dtype=torch.float16, device="cuda", l2_persistent_plan=l2)
        attn.plan_tree(**tree)
        outs.append(attn.run(q, k, v))
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])
    rows = [token_rows(tree, n, ps) for n in tree["query_nodes"]]
    ref = torch_reference(q, k, v, rows)
    assert ((outs[1].float() - ref).norm() / ref.norm()).item() < 2e-3


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(32, 8), (16, 1), (8, 8), (28, 4)])
def test_gpu_matches_torch_reference(dtype, heads):
    rng = np.random.default_rng(6)
    ps, D = (16, 128) if heads != (28, 4) else (5, 128)  # a group of 7 and 5-token pages, as well
    tree, pages = random_tree(rng, 40, 48, ps, max_tokens=300)
    attn = treeattn.TreeAttention(*heads, D, ps, pages, dtype=dtype, device="cuda")
    k = torch.randn(pages, ps, heads[1], D, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(48, heads[0], D, dtype=dtype, device="cuda")
    rows = [token_rows(tree, n, ps) for n in tree["query_nodes"]]
    ref = torch_reference(q, k, v, rows)
    for planner_tree in (tree,):
        attn.plan_tree(**planner_tree)
        out, lse = attn.run(q, k, v, return_lse=True)
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
def test_gpu_device_index_is_kept_and_checked():
    """device="cuda:<i>" holds its buffers and runs on device i whatever device
    is current; an index past the GPUs is refused; with two GPUs, tensors on
    the other device are refused (PyTorch and DLPack) and a TreeAttention on
    device 1 runs correctly while device 0 is current."""
    gpus = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"device_index = {gpus} is out of range \\[0, {gpus}\\)"):
        treeattn.TreeAttention(8, 2, 64, 16, 8, device=f"cuda:{gpus}")
    assert treeattn.TreeAttention(8, 2, 64, 16, 8, device="cuda").device_index == torch.cuda.current_device()
    if gpus < 2:
        pytest.skip("the cross-device checks need two GPUs")
    rng = np.random.default_rng(8)
    tree, pages = random_tree(rng, 12, 6, 16, max_tokens=100)
    rows = [token_rows(tree, n, 16) for n in tree["query_nodes"]]
    torch.cuda.set_device(0)
    attn = treeattn.TreeAttention(8, 2, 64, 16, pages, device=torch.device("cuda", 1))
    assert attn.device_index == 1
    attn.plan_tree(**tree)
    q = torch.randn(6, 8, 64, dtype=torch.float16, device="cuda:1")
    k = torch.randn(pages, 16, 2, 64, dtype=torch.float16, device="cuda:1")
    v = torch.randn_like(k)
    out = attn.run(q, k, v)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    ref = torch_reference(q, k, v, rows)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-3
    with pytest.raises(ValueError, match="q: expected a tensor on cuda:1 .* got one on cuda:0"):
        attn.run(q.to("cuda:0"), k, v)
    with pytest.raises(ValueError, match="out: expected a tensor on cuda:1 .* got one on cuda:0"):
        attn.run(q, k, v, out=torch.empty(6, 8, 64, dtype=torch.float16, device="cuda:0"))
    with pytest.raises(ValueError, match="lse: must be on the TreeAttention's device, as q, got one on cuda:0"):
        attn.run(q, k, v, lse=torch.empty(6, 8, device="cuda:0"))

    class DLPackOnly:  # not a torch.Tensor: read through DLPack, whose device id is checked
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    with pytest.raises(ValueError, match="k_pool: expected a tensor on cuda:1 .* got one on cuda:0"):
        attn.run(q, DLPackOnly(k.to("cuda:0")), v, out=torch.empty_like(q))


def capture_layers(attn, q, k, v, out):
    """A CUDA graph of one run() per layer (q, k, v, out: [layers, ...]), after a warm-up run
    of them on a side stream outside capture."""
    def step():
        for l in range(q.shape[0]):
            attn.run(q[l], k[l], v[l], out=out[l])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
def test_gpu_graph_replays_survive_replanning():
    """One decode step of 32 layers' run() calls captured once, replayed for 100
    steps while every branch grows a token per step, branches fork and finish;
    re-planned between replays; each replay equals an eager run."""
    H, Hkv, D, ps, layers = 32, 8, 128, 16, 32
    max_q, pages = 64, 4096
    dtype = torch.bfloat16
    rng = np.random.default_rng(7)
    k = torch.randn(layers, pages, ps, Hkv, D, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype=dtype, device="cuda", max_queries=max_q,
                                  max_nodes=256, max_page_refs=8192)
    q = torch.randn(layers, max_q, H, D, dtype=dtype, device="cuda")
    out = torch.zeros_like(q)
    # prompt node 0 (500 tokens) and branches with their own pages
    free = list(range(pages))
    rng.shuffle(free)
    prompt_pages = [free.pop() for _ in range((500 + ps - 1) // ps)]
    branches = [[0, []] for _ in range(8)]  # (tokens, pages)

    def step_tree():
        parents, ntok, offs, pids, qn = [-1], [500], [0, len(prompt_pages)], list(prompt_pages), []
        for t, p in branches:
            parents.append(0); ntok.append(t); pids += p; offs.append(len(pids)); qn.append(len(parents) - 1)
        while len(qn) < max_q:  # pad to the graph's batch: extra queries on the prompt
            qn.append(0)
        return dict(parents=parents, num_tokens=ntok, page_offsets=offs, page_ids=pids, query_nodes=qn)

    def grow():
        for b in branches:
            if b[0] % ps == 0:
                b[1].append(free.pop())
            b[0] += 1

    grow()
    attn.plan_tree(**step_tree())
    graph = capture_layers(attn, q, k, v, out)
    eager = torch.empty_like(out)
    for step in range(100):
        if step % 10 == 5 and len(branches) < 24:  # fork
            t, p = branches[int(rng.integers(len(branches)))]
            branches.append([0, []])
        if step % 15 == 7 and len(branches) > 4:  # finish
            t, p = branches.pop(int(rng.integers(len(branches))))
            free.extend(p)
        grow()
        attn.plan_tree(**step_tree())
        q.normal_()
        graph.replay()
        for l in range(layers):
            attn.run(q[l], k[l], v[l], out=eager[l])
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"step {step}: replay differs from eager"
    rows = [token_rows(step_tree(), n, ps) for n in step_tree()["query_nodes"]]
    ref = torch_reference(q[0], k[0], v[0], rows)
    assert ((out[0].float() - ref).norm() / ref.norm()).item() < 1e-2


def test_graph_launch_masks_on_the_cpu():
    """The CPU executor has no launches: the masks read 0, 0 may be set, any other mask is refused."""
    attn, tree = make_small()
    assert attn.plan_launches == 0
    attn.plan_tree(**tree)
    assert (attn.plan_launches, attn.graph_launches) == (0, 0)
    attn.graph_launches = 0
    with pytest.raises(ValueError, match=r"set_graph_launches\(3\): the CPU executor has no launches"):
        attn.graph_launches = 3
    with pytest.raises(ValueError, match="graph_launches: -1 is not a mask"):
        attn.graph_launches = -1
    with pytest.raises(ValueError, match="graph_launches: 4294967296 is not a mask"):
        attn.graph_launches = 1 << 32
    with pytest.raises(TypeError, match="graph_launches: expected an int mask, got str"):
        attn.graph_launches = "1"
    assert attn.graph_launches == 0


def forest_of_prompts(prompts, prompt_tokens, branches, branch_tokens, queries, page_size):
    """`prompts` roots of prompt_tokens, each with `branches` children of branch_tokens (0: none),
    pages handed out in order; `queries` queries spread over the branches (or the roots)."""
    parents, ntok, offs, pids = [], [], [0], []

    def add(parent, t):
        parents.append(parent); ntok.append(t)
        pids.extend(range(len(pids), len(pids) + (t + page_size - 1) // page_size)); offs.append(len(pids))
        return len(parents) - 1

    leaves = []
    for _ in range(prompts):
        root = add(-1, prompt_tokens)
        leaves += [add(root, branch_tokens) for _ in range(branches)] if branches else [root]
    qn = [leaves[i % len(leaves)] for i in range(queries)]
    return dict(parents=parents, num_tokens=ntok, page_offsets=offs, page_ids=pids, query_nodes=qn)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
def test_gpu_graphs_per_launch_set():
    """A graph per launch set: captured under graph_launches = plan_launches the first time a step's
    plan needs that set, replayed for every step whose plan needs it, each replay equal to an eager
    run. A graph of launch 0 alone replays every plan within tolerance of an eager run."""
    H, Hkv, D, ps, layers, max_q, pages = 32, 8, 128, 16, 3, 48, 4096
    dtype = torch.float16
    k = torch.randn(layers, pages, ps, Hkv, D, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype=dtype, device="cuda", max_queries=max_q,
                                  max_nodes=256, max_page_refs=8192)
    q = torch.randn(layers, max_q, H, D, dtype=dtype, device="cuda")
    out, eager = torch.zeros_like(q), torch.zeros_like(q)
    trees = [forest_of_prompts(1, 1000, 48, 20, max_q, ps),   # a prompt of 192 rows, short branches
             forest_of_prompts(48, 300, 0, 0, max_q, ps),     # independent sequences
             forest_of_prompts(3, 500, 16, 40, max_q, ps),    # three prompts of 64 rows
             forest_of_prompts(12, 200, 0, 0, max_q, ps),     # four queries a root
             forest_of_prompts(6, 300, 8, 20, max_q, ps)]     # six prompts of 32 rows

    attn.plan_tree(**trees[0])
    attn.graph_launches = 0   # launch 0 alone (recorded whatever the mask)
    assert attn.graph_launches == 0
    first_only = capture_layers(attn, q, k, v, out)
    graphs = {}
    for step in range(2 * len(trees)):
        attn.plan_tree(**trees[step % len(trees)])
        key = attn.plan_launches
        if key not in graphs:
            attn.graph_launches = key
            graphs[key] = capture_layers(attn, q, k, v, out)
        q.normal_()
        for l in range(layers):
            attn.run(q[l], k[l], v[l], out=eager[l])
        out.fill_(float("nan"))
        graphs[key].replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"step {step}: the replay of launches {key} differs from eager"
        out.fill_(float("nan"))
        first_only.replay()
        torch.cuda.synchronize()
        err = ((out.float() - eager.float()).norm() / eager.float().norm()).item()
        assert err < 2e-3, f"step {step}: launch 0 alone, relative error {err}"
    assert len(graphs) >= 2, f"the trees' plans need only the launch sets {sorted(graphs)}"


def test_bound_run_equals_run_and_checks_the_plan_size():
    rng = np.random.default_rng(8)
    attn, tree = make_small()
    attn.plan_tree(**tree)
    q = rng.uniform(-1, 1, (2, 4, 64)).astype(np.float16)
    k = rng.uniform(-1, 1, (16, 4, 2, 64)).astype(np.float16)
    v = rng.uniform(-1, 1, (16, 4, 2, 64)).astype(np.float16)
    expected = attn.run(q, k, v)
    for args in [(q, k, v), tuple(torch.from_numpy(x) for x in (q, k, v))]:
        out = np.zeros_like(q) if isinstance(args[0], np.ndarray) else torch.zeros(2, 4, 64, dtype=torch.float16)
        bound = attn.bind(*args, out)
        got = bound()
        assert got is out
        assert np.array_equal(np.asarray(out), expected)
    with pytest.raises(TypeError, match="q: expected dtype float16"):
        attn.bind(q.astype(np.float32), k, v, np.zeros_like(q))
    attn.plan_tree(**{**tree, "query_nodes": [1, 1, 0]})
    with pytest.raises(ValueError, match="the plan has 3 queries, the bound tensors 2"):
        bound()


def test_run_and_plan_from_two_threads_see_one_whole_plan():
    """run() releases the GIL; a plan_tree() from another thread meanwhile must
    not swap the plan under it (this crashed before the runtime held a lock).
    Both trees have 16 queries, so every run is accepted and equals one tree's
    output bit for bit."""
    import threading

    ps, pages = 16, 512
    attn = treeattn.TreeAttention(8, 2, 64, ps, pages, device="cpu", cpu_threads=1, max_extension_tokens=0,
                                  max_queries=16, max_nodes=64, max_page_refs=pages)

    def fewshot(prompt, leaf):
        ntok = [prompt] + [leaf + i for i in range(16)]
        offs, pids = [0], []
        for t in ntok:
            pids += range(len(pids), len(pids) + (t + ps - 1) // ps)
            offs.append(len(pids))
        return dict(parents=[-1] + [0] * 16, num_tokens=ntok, page_offsets=offs, page_ids=pids,
                    query_nodes=list(range(1, 17)))

    trees = [fewshot(1200, 9), fewshot(200, 120)]
    rng = np.random.default_rng(11)
    q = rng.uniform(-1, 1, (16, 8, 64)).astype(np.float16)
    k = rng.uniform(-1, 1, (pages, ps, 2, 64)).astype(np.float16)
    v = rng.uniform(-1, 1, (pages, ps, 2, 64)).astype(np.float16)
    expected = []
    for t in trees:
        attn.plan_tree(**t)
        expected.append(attn.run(q, k, v))
    assert not np.array_equal(expected[0], expected[1])
    done, failures, runs = threading.Event(), [], [0]

    def runner():
        out = np.empty_like(q)
        while not done.is_set() or runs[0] < 20:
            attn.run(q, k, v, out)
            runs[0] += 1
            if not any(np.array_equal(out, e) for e in expected):
                failures.append(runs[0])

    thread = threading.Thread(target=runner)
    thread.start()
    try:
        for i in range(300):
            attn.plan_tree(**trees[i % 2])
    finally:
        done.set()
        thread.join()
    assert failures == [], f"{len(failures)} of {runs[0]} runs matched neither tree"


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("framework", ["cupy", "jax"])
def test_gpu_dlpack_frameworks(framework):
    """q, k and v from CuPy or JAX through DLPack (out from CuPy, or PyTorch for
    JAX, whose arrays are immutable), against the same run on PyTorch tensors."""
    rng = np.random.default_rng(9)
    ps, H, Hkv, D = 16, 8, 2, 128
    tree, pages = random_tree(rng, 10, 6, ps, max_tokens=100)
    q = rng.uniform(-1, 1, (6, H, D)).astype(np.float16)
    k = rng.uniform(-1, 1, (pages, ps, Hkv, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (pages, ps, Hkv, D)).astype(np.float16)
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype="fp16", device="cuda")
    attn.plan_tree(**tree)
    expected = attn.run(*(torch.from_numpy(x).cuda() for x in (q, k, v)))
    torch.cuda.synchronize()
    if framework == "cupy":
        cp = pytest.importorskip("cupy")
        out = cp.empty(q.shape, dtype=cp.float16)
        attn.run(cp.asarray(q), cp.asarray(k), cp.asarray(v), out=out, stream=cp.cuda.get_current_stream().ptr)
        cp.cuda.get_current_stream().synchronize()
        got = torch.from_numpy(cp.asnumpy(out)).cuda()
    else:
        jnp = pytest.importorskip("jax.numpy")
        jax = pytest.importorskip("jax")
        if not any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("jax has no GPU here")
        arrays = [jax.block_until_ready(jnp.asarray(x)) for x in (q, k, v)]
        out = torch.empty(q.shape, dtype=torch.float16, device="cuda")
        attn.run(*arrays, out=out)
        torch.cuda.synchronize()
        got = out
    assert torch.equal(got, expected)


# ---- run()'s PyTorch fast path (attributes read in C++, no DLPack) ------------------

def torch_small(seed=10):
    """make_small()'s runtime, planned, with CPU torch q, k, v, out and a numpy reference out."""
    attn, tree = make_small()
    attn.plan_tree(**tree)
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(2, 4, 64, generator=g).half()
    k = torch.rand(16, 4, 2, 64, generator=g).half()
    v = torch.rand(16, 4, 2, 64, generator=g).half()
    return attn, tree, q, k, v


def test_instance_run_is_the_cpp_entry_and_agrees_with_the_method():
    """attn.run is the C++ entry (no Python frame per layer call); the class's
    run() documents it and calls the same entry: every argument form returns
    the same objects and values both ways, and its errors are the same. A
    subclass that overrides run() keeps its own."""
    attn, _, q, k, v = torch_small()
    assert type(attn.run).__name__ != "method"
    method = lambda *a, **kw: treeattn.TreeAttention.run(attn, *a, **kw)
    for run in (attn.run, method):
        out = torch.zeros_like(q)
        assert run(q, k, v, out) is out
        got, lse = run(q, k, v, return_lse=True)
        assert got.shape == q.shape and got.dtype == q.dtype and lse.shape == (2, 4) and lse.dtype == torch.float32
        assert np.array_equal(got.numpy(), out.numpy())
        lse2 = torch.zeros(2, 4)
        both = run(q, k, v, torch.zeros_like(q), lse=lse2)
        assert isinstance(both, tuple) and both[1] is lse2 and np.array_equal(lse2.numpy(), lse.numpy())
        assert not isinstance(run(q.numpy(), k.numpy(), v.numpy(), return_lse=0), tuple)
        with pytest.raises(TypeError, match="positional arguments|incompatible function arguments"):
            run(q, k, v, out, True)  # return_lse is keyword-only
        with pytest.raises(TypeError, match="q: expected a tensor .* got list"):
            run([1.0], k, v)
        with pytest.raises(TypeError, match="q: expected a tensor .*where out is not given.*got memoryview; or pass out"):
            run(memoryview(q.numpy()), k, v)
        with pytest.raises(ValueError, match="out: must not overlap q"):
            run(q, k, v, q)

    class Logged(treeattn.TreeAttention):
        calls = 0

        def run(self, *a, **kw):
            Logged.calls += 1
            return super().run(*a, **kw)

    sub = Logged(4, 2, 64, 4, 16, device="cpu", max_queries=4, max_nodes=8, max_page_refs=16)
    sub.plan_tree(**make_small()[1])
    sub.run(q, k, v, torch.zeros_like(q))
    assert Logged.calls == 1


def test_torch_run_equals_numpy_run_and_takes_every_argument_form():
    attn, _, q, k, v = torch_small()
    expected, expected_lse = attn.run(q.numpy(), k.numpy(), v.numpy(), return_lse=True)
    out = torch.zeros_like(q)
    assert attn.run(q, k, v, out) is out
    assert np.array_equal(out.numpy(), expected)
    out2, lse = attn.run(q, k, v, return_lse=True)
    assert np.array_equal(out2.numpy(), expected) and np.array_equal(lse.numpy(), expected_lse)
    lse2 = torch.zeros(2, 4)
    got = attn.run(q, k, v, out=torch.zeros_like(q), lse=lse2, scale=None, stream=None)
    assert isinstance(got, tuple) and got[1] is lse2 and np.array_equal(lse2.numpy(), expected_lse)
    # mixed: torch q and out, numpy pools
    out3 = torch.zeros_like(q)
    attn.run(q, k.numpy(), v.numpy(), out3)
    assert np.array_equal(out3.numpy(), expected)
    # subclasses: nn.Parameter (TensorBase's descriptors) and one that overrides data_ptr (attribute path)
    class Odd(torch.Tensor):
        def data_ptr(self):
            return super().data_ptr()

    out4 = torch.zeros_like(q)
    attn.run(torch.nn.Parameter(q, requires_grad=False), k.as_subclass(Odd), v.as_subclass(Odd), out4.as_subclass(Odd))
    assert np.array_equal(out4.numpy(), expected)
    # scale: a number of any kind; the same as the default when it is the default
    out5 = torch.zeros_like(q)
    attn.run(q, k, v, out5, scale=np.float32(1 / 8))
    assert np.array_equal(out5.numpy(), expected)
    out6 = torch.zeros_like(q)
    attn.run(q, k, v, out6, scale=0.5)
    assert not np.array_equal(out6.numpy(), expected)


def test_torch_bad_run_arguments_name_the_argument():
    attn, tree, q, k, v = torch_small()
    out = torch.zeros_like(q)
    cases = [
        (TypeError, "q: expected dtype float16 .* got float32", dict(q=q.float())),
        (TypeError, "k_pool: expected dtype float16 .* got bfloat16", dict(k=k.bfloat16())),
        (TypeError, "out: expected dtype float16 .* got torch.int64", dict(out=torch.zeros(2, 4, 64, dtype=torch.int64))),
        (ValueError, r"q: 3 queries, the plan has 2", dict(q=torch.zeros(3, 4, 64, dtype=torch.float16))),
        (ValueError, r"out: 1 queries, the plan has 2", dict(out=torch.zeros(1, 4, 64, dtype=torch.float16))),
        (ValueError, r"q: expected 3 dimensions, got shape \[2, 256\]", dict(q=q.reshape(2, 256))),
        (ValueError, r"q: expected 3 dimensions, got shape \[1, 1, 1, 1, 1, 1, 1, 1, \.\.\.\]",
         dict(q=torch.zeros([1] * 9, dtype=torch.float16))),
        (ValueError, r"q: shape \[2, 2, 64\] must end in \[4, 64\]", dict(q=q[:, :2])),
        (ValueError, r"v_pool: shape \[16, 4, 1, 64\] must end in \[2, 64\]", dict(v=v[:, :, :1])),
        (ValueError, r"k_pool: shape \[8, 4, 2, 64\] must be \[>= num_pages = 16", dict(k=k[:8], v=v[:8])),
        (ValueError, r"k_pool: shape \[16, 2, 2, 64\] must be \[>= num_pages = 16, page_size = 4", dict(k=k[:, :2])),
        (ValueError, "q: the last two dimensions must be dense .* got strides 128, 2",
         dict(q=torch.zeros(2, 4, 128, dtype=torch.float16)[:, :, ::2])),
        (ValueError, "out: the last two dimensions must be dense .* got strides 1, 4",
         dict(out=torch.zeros(2, 64, 4, dtype=torch.float16).transpose(1, 2))),
        (ValueError, "k_pool and v_pool must have the same strides",
         dict(k=torch.zeros(16, 2, 4, 2, 64, dtype=torch.float16)[:, 0])),
        (ValueError, "out: must not overlap q's memory", dict(out=q)),
        (ValueError, "q: expected a tensor on the cpu .* got one on meta",
         dict(q=torch.empty(2, 4, 64, dtype=torch.float16, device="meta"))),
        (TypeError, "v_pool: expected a tensor .* got list", dict(v=[1, 2])),
        (TypeError, "q: expected a tensor .* got NoneType", dict(q=None)),
        (ValueError, "k_pool: cannot read the tensor's", dict(k=torch.zeros(16, 4, 2, 64, dtype=torch.float16).to_sparse())),
    ]
    for exc, words, change in cases:
        a = dict(q=q, k=k, v=v, out=out, **{})
        a.update(change)
        with pytest.raises(exc, match=words):
            attn.run(a["q"], a["k"], a["v"], a["out"])
        with pytest.raises(exc, match=words):  # bind() checks the same
            attn.bind(a["q"], a["k"], a["v"], a["out"])
    with pytest.raises(TypeError, match="lse: expected dtype float32, got float16"):
        attn.run(q, k, v, out, lse=torch.zeros(2, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"lse: expected a contiguous \[2, 4\] tensor, got shape \[4, 2\]"):
        attn.run(q, k, v, out, lse=torch.zeros(2, 4).t())
    with pytest.raises(ValueError, match="lse: must be on the TreeAttention.s device, as q, got one on meta"):
        attn.run(q, k, v, out, lse=torch.zeros(2, 4, device="meta"))
    with pytest.raises(TypeError, match="scale: expected a number"):
        attn.run(q, k, v, out, scale="x")
    with pytest.raises(TypeError, match="stream: expected a stream handle"):
        attn.run(q, k, v, out, stream="x")
    with pytest.raises(ValueError, match="stream: expected a stream handle"):
        attn.run(q, k, v, out, stream=-1)
    # AttentionArgs reads a stride of 0 as "dense": expanded views are refused,
    # and rows of out that overlap one another (found by an adversarial probe:
    # an expanded out was written past its buffer, an expanded q read as NaN).
    broadcast = [
        ("q", dict(q=q[:1].expand(2, 4, 64)), r"q: stride 0 in dimension 0 .*shape \[2, 4, 64\], strides \[0, 64, 1\]"),
        ("out", dict(out=out[:1].expand(2, 4, 64)), r"out: stride 0 in dimension 0"),
        ("k_pool", dict(k=k[:1].expand(16, 4, 2, 64), v=v[:1].expand(16, 4, 2, 64)), r"k_pool: stride 0 in dimension 0"),
        ("v_pool", dict(k=k[:, :1].expand(16, 4, 2, 64), v=v[:, :1].expand(16, 4, 2, 64)),
         r"k_pool: stride 0 in dimension 1"),
        ("out", dict(out=torch.zeros(2 * 256, dtype=torch.float16).as_strided((2, 4, 64), (64, 64, 1))),
         r"out: its queries' rows overlap \(shape \[2, 4, 64\], strides \[64, 64, 1\]; \|stride\[0\]\| must be >= "
         r"num_qo_heads x head_dim = 256\)"),
    ]
    for _, change, words in broadcast:
        a = dict(q=q, k=k, v=v, out=out)
        a.update(change)
        with pytest.raises(ValueError, match=words):
            attn.run(a["q"], a["k"], a["v"], a["out"])
        with pytest.raises(ValueError, match=words):
            attn.bind(a["q"], a["k"], a["v"], a["out"])
    with pytest.raises(ValueError, match=r"lse: expected a contiguous \[2, 4\] tensor, got shape \[2, 4\], strides \[1, 2\]"):
        attn.run(q, k, v, out, lse=torch.zeros(4, 2).t())
    # float32 is what the runtime takes: a scale that rounds to 0 (the default) or overflows is refused.
    with pytest.raises(ValueError, match=r"scale = 1e-50 is not representable as a float32 \(it rounds to 0\)"):
        attn.run(q, k, v, out, scale=1e-50)
    with pytest.raises(ValueError, match=r"k_scale = 1e\+50 is not representable as a float32 \(it overflows\)"):
        attn.run(q, k, v, out, k_scale=1e50)
    with pytest.raises(ValueError, match=r"q: expected 3 dimensions, got shape \[\]"):
        attn.run(torch.tensor(1.0, dtype=torch.float16), k, v, return_lse=True)
    assert not out.any()  # nothing ran
    # An expanded dimension of one element is read as it is (its stride is never used).
    one = treeattn.TreeAttention(4, 2, 64, page_size=4, num_pages=16, device="cpu")
    one.plan_tree(tree["parents"], tree["num_tokens"], tree["page_offsets"], tree["page_ids"], tree["query_nodes"][:1])
    q1 = q[0].as_strided((1, 4, 64), (0, 64, 1))
    np.testing.assert_array_equal(one.run(q1, k, v).numpy(), one.run(q[:1].contiguous(), k, v).numpy())


def test_torch_tensors_changed_in_place_between_runs_are_read_again():
    """The same Python tensor objects, re-pointed or resized in place between
    calls (set_, resize_, as_strided_, .data =): each run reads them again. A
    memo of the last checked tensors keyed by identity would miss these."""
    attn, _, q, k, v = torch_small()
    expected = attn.run(q.numpy(), k.numpy(), v.numpy())
    out = torch.zeros_like(q)
    attn.run(q, k, v, out)
    assert np.array_equal(out.numpy(), expected)

    # out re-pointed to other memory: the new memory gets the result, the old is left alone
    old = out.clone()
    fresh = torch.zeros(2, 4, 64, dtype=torch.float16)
    held = out.clone()
    out.set_(fresh.untyped_storage(), 0, fresh.shape, fresh.stride())
    held_ptr = held.data_ptr()
    attn.run(q, k, v, out)
    assert out.data_ptr() == fresh.data_ptr() and np.array_equal(fresh.numpy(), expected)
    assert held.data_ptr() == held_ptr and np.array_equal(held.numpy(), old.numpy())

    # q re-pointed to other values: the result follows them
    q2 = torch.rand(2, 4, 64, generator=torch.Generator().manual_seed(99)).half()
    qq = q.clone()
    attn.run(qq, k, v, out)
    qq.set_(q2.untyped_storage(), 0, q2.shape, q2.stride())
    attn.run(qq, k, v, out)
    assert np.array_equal(out.numpy(), attn.run(q2.numpy(), k.numpy(), v.numpy()))

    # resized in place: shape checks see the new shape
    kk = k.clone()
    attn.run(q, kk, v, out)
    kk.resize_(8, 4, 2, 64)
    with pytest.raises(ValueError, match=r"k_pool: shape \[8, 4, 2, 64\]"):
        attn.run(q, kk, v, out)
    qr = q.clone()
    attn.run(qr, k, v, out)
    qr.resize_(3, 4, 64)
    with pytest.raises(ValueError, match="q: 3 queries"):
        attn.run(qr, k, v, out)

    # restrided in place: the last dimension no longer dense
    qv = torch.zeros(1024, dtype=torch.float16)[:512].view(2, 4, 64)
    qv.copy_(q)
    attn.run(qv, k, v, out)
    qv.as_strided_((2, 4, 64), (256, 64, 2))
    with pytest.raises(ValueError, match="q: the last two dimensions must be dense"):
        attn.run(qv, k, v, out)

    # .data swapped (no version bump): dtype and pointer change
    od = torch.zeros_like(q)
    attn.run(q, k, v, od)
    od.data = od.data.view(torch.bfloat16)  # the same memory, shape and strides
    with pytest.raises(TypeError, match="out: expected dtype float16 .* got bfloat16"):
        attn.run(q, k, v, od)
    od.data = torch.zeros(2, 4, 64)
    with pytest.raises(TypeError, match="out: expected dtype float16 .* got float32"):
        attn.run(q, k, v, od)
    target = torch.zeros_like(q)
    od.data = target
    attn.run(q, k, v, od)
    assert np.array_equal(target.numpy(), expected)


def test_bound_run_takes_the_default_stream_and_an_explicit_one():
    attn, _, q, k, v = torch_small()
    expected = attn.run(q.numpy(), k.numpy(), v.numpy())
    out = torch.zeros_like(q)
    bound = attn.bind(q, k, v, out)
    assert bound() is out and np.array_equal(out.numpy(), expected)
    out.zero_()
    assert bound(0) is out and np.array_equal(out.numpy(), expected)
    with pytest.raises(TypeError, match="stream"):
        bound("x")


def test_run_takes_its_stream_from_the_source_only_when_none_is_given():
    """The stream source the Python layer hands the C++ entry (PyTorch's current
    stream on CUDA): fn(arg), or fn() without arg, called once per run() and
    bound call that is given no stream; an explicit stream is used as given. On
    the CPU the executor ignores the handle, so this checks the plumbing only."""
    attn, _, q, k, v = torch_small()
    out = torch.zeros_like(q)
    calls = []

    def source(*args):
        calls.append(args)
        return 0

    for arg, seen in [(7, (7,)), (None, ())]:
        calls.clear()
        runner = treeattn._treeattn._Runner(attn._impl, source, arg, False, treeattn._alloc_run_output)
        runner.call(q, k, v, out)
        assert calls == [seen]
        runner.call(q, k, v, out, stream=0)
        assert calls == [seen]
        bound = runner.bind(q, k, v, out, None, None, None, None)
        bound(None)
        bound(5)
        assert calls == [seen, seen]
    runner = treeattn._treeattn._Runner(attn._impl, lambda: "not a stream", None, False, treeattn._alloc_run_output)
    with pytest.raises(TypeError, match="stream: expected a stream handle"):
        runner.call(q, k, v, out)


def test_run_overhead_bench_runs():
    """bench/runtime/run_overhead.py (what bench_runtime.py runs on CUDA) on the CPU, briefly."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "runtime", "run_overhead.py")
    spec = importlib.util.spec_from_file_location("run_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.measure("cpu", rounds=10, number=20)
    assert set(r["us"]) >= {"run(q, k, v, out)", "bound()", "C++ entry"} and r["overhead_us"] > -1


def test_block_tables_example_decodes_against_its_reference():
    """examples/block_tables.py on the CPU: a vLLM-style loop with forks and finishes, its
    outputs against a per-sequence softmax, most steps extending the last plan."""
    import importlib.util
    import os

    pytest.importorskip("torch")
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "block_tables.py")
    spec = importlib.util.spec_from_file_location("block_tables_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stats, worst = mod.main(["--device", "cpu", "--steps", "40", "--prompt-len", "128", "--check", "4", "--quiet"])
    assert worst < 2e-3
    assert stats["planned"] + stats["extended"] == 40
    assert stats["extended"] > stats["planned"], stats  # decode steps grow the tree and extend the plan


def test_speculative_verify_example_matches_its_reference_both_ways():
    """examples/speculative_verify.py on the CPU: draft token trees verified with
    plan_tree_queries (drafts in the pool) and with plan_tree + lse merged with a
    dense tree-masked part (drafts outside it), both against a per-query softmax."""
    import importlib.util
    import os

    pytest.importorskip("torch")
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "speculative_verify.py")
    spec = importlib.util.spec_from_file_location("speculative_verify_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    worst = mod.main(["--device", "cpu", "--steps", "3", "--requests", "3", "--prompt-len", "100",
                      "--context-len", "40", "--quiet"])
    assert worst < 2e-3


# -- torch.ops.treeattn.run (treeattn/torch_ops.py) -------------------------
torch_ops = pytest.importorskip("treeattn.torch_ops")
needs_custom_op = pytest.mark.skipif(not torch_ops.available, reason="needs torch.library.custom_op (PyTorch >= 2.4)")


@needs_custom_op
def test_run_op_equals_run_and_compiles_without_a_graph_break():
    attn, _, q, k, v = torch_small()
    expected, expected_lse = attn.run(q, k, v, return_lse=True)
    out, lse = torch.zeros_like(q), torch.zeros(2, 4)
    assert attn.run_op(q, k, v, out, lse=lse) == (out, lse)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    torch.library.opcheck(torch.ops.treeattn.run.default,
                          (attn.op_handle, q, k, v, torch.zeros_like(q), None, 0.0, 1.0, 1.0))

    calls = []

    def count_graphs(gm, example_inputs):  # a backend that records each graph Dynamo hands over
        calls.append(gm)
        return gm.forward

    @torch.compile(backend=count_graphs, fullgraph=True)
    def layer(q, k, v, out, lse):
        attn.run_op(q * 1, k, v, out, lse=lse, scale=0.125)  # 0.125 = 1/sqrt(64): the default
        return out.float().sum(-1) + lse

    out2, lse2 = torch.zeros_like(q), torch.zeros(2, 4)
    got = layer(q, k, v, out2, lse2)
    assert len(calls) == 1, "one graph: the op traced without a break"
    assert any(n.target is torch.ops.treeattn.run.default for n in calls[0].graph.nodes)
    assert torch.equal(out2, expected) and torch.equal(lse2, expected_lse)
    assert torch.allclose(got, expected.float().sum(-1) + expected_lse)


@needs_custom_op
def test_run_op_checks_its_arguments_and_handle():
    attn, _, q, k, v = torch_small()
    with pytest.raises(ValueError, match="out"):
        attn.run_op(q, k, v, torch.zeros(3, 4, 64).half())
    with pytest.raises(ValueError, match="handle: no live TreeAttention has handle -1"):
        torch.ops.treeattn.run(-1, q, k, v, torch.zeros_like(q), None, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="out: run_op writes into out"):  # it returned None, the result discarded
        attn.run_op(q, k, v, None)
    # The op's dispatcher refused these with a NotImplementedError (a nested tensor: "Could not run
    # 'treeattn::run' with arguments from the 'NestedTensorCPU' backend") or a schema error, naming no argument.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors warn that they are a prototype
        nested = torch.nested.nested_tensor([q[i] for i in range(q.shape[0])])
    with pytest.raises(ValueError, match=re.escape("q: expected a dense tensor, got a nested one")):
        attn.run_op(nested, k, v, torch.zeros_like(q))
    with pytest.raises(ValueError, match=re.escape("out: expected a dense tensor, got a nested one")):
        attn.run_op(q, k, v, nested)
    with pytest.raises(TypeError, match=re.escape("k_pool: run_op takes PyTorch tensors, got ndarray")):
        attn.run_op(q, k.numpy(), v, torch.zeros_like(q))


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU and a CUDA build")
@needs_custom_op
def test_gpu_run_op_in_an_inductor_compiled_layer():
    rng = np.random.default_rng(9)
    H, Hkv, D, ps = 32, 8, 128, 16
    tree, pages = random_tree(rng, 30, 24, ps, max_tokens=200)
    attn = treeattn.TreeAttention(H, Hkv, D, ps, pages, dtype=torch.bfloat16, device="cuda")
    attn.plan_tree(**tree)
    k = torch.randn(pages, ps, Hkv, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    x = torch.randn(24, H * D, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(H * D, H * D, dtype=torch.bfloat16, device="cuda") / (H * D) ** 0.5

    def layer(x, out):
        attn.run_op((x @ w).view(-1, H, D), k, v, out)
        return out.view(-1, H * D) @ w

    eager = layer(x, torch.empty(24, H, D, dtype=torch.bfloat16, device="cuda"))
    compiled = torch.compile(layer, fullgraph=True)(x, torch.empty(24, H, D, dtype=torch.bfloat16, device="cuda"))
    torch.cuda.synchronize()
    assert ((compiled.float() - eager.float()).norm() / eager.float().norm()).item() < 1e-2


def test_set_auto_cost_model_changes_autos_choice_and_names_bad_files(tmp_path):
    """treeattn.set_auto_cost_model(FILE) (a table of `treeattn calibrate --auto`) is what planner "auto" prices
    with from the next plan on; None restores the built-in table; a bad file is a ValueError naming it."""
    rng = np.random.default_rng(3)
    ps = 4
    tree = dict(parents=[-1, 0, 0, 1, 1, 2], num_tokens=[37, 20, 25, 9, 14, 11], query_nodes=[3, 3, 4, 4, 5, 5])
    pages = sum((t + ps - 1) // ps for t in tree["num_tokens"])
    offsets = np.concatenate([[0], np.cumsum([(t + ps - 1) // ps for t in tree["num_tokens"]])]).tolist()
    tree.update(page_offsets=offsets, page_ids=rng.permutation(pages).tolist())
    attn = treeattn.TreeAttention(4, 2, 64, ps, pages, device="cpu", max_queries=8, max_nodes=8, max_page_refs=64,
                                  max_extension_tokens=0)  # every plan_tree plans afresh
    builtin = treeattn.auto_cost_model()
    assert builtin["device"] == "NVIDIA H100 80GB HBM3" and builtin["coefficients"]["partial_mb"] > 0
    attn.plan_tree(**tree)
    # A tree this small: the built-in table takes per-query (no merge launch), which reads shared KV once per query.
    builtin_plan = attn.plan_summary()
    assert builtin_plan["partial_bytes"] == 0 and builtin_plan["kv_bytes"] > builtin_plan["unique_kv_bytes"]
    table = dict(builtin, device="Test GPU", margin=0.0,
                 coefficients={k: (1000.0 if k == "kv_mb" else 0.0) for k in builtin["coefficients"]})
    path = tmp_path / "auto_cost_test.json"
    path.write_text(__import__("json").dumps(table))
    try:
        treeattn.set_auto_cost_model(path)
        assert treeattn.auto_cost_model()["device"] == "Test GPU"
        attn.plan_tree(**tree)
        summary = attn.plan_summary()
        # KV priced at 1000 us/MB: auto takes node's plan, each node's KV read once and the pieces merged.
        assert summary["kv_bytes"] == summary["unique_kv_bytes"] and summary["partial_bytes"] > 0, summary
        q = rng.uniform(-1, 1, (6, 4, 64)).astype(np.float16)
        k = rng.uniform(-1, 1, (pages, ps, 2, 64)).astype(np.float16)
        v = rng.uniform(-1, 1, (pages, ps, 2, 64)).astype(np.float16)
        ref, _ = reference(q, k, v, [token_rows(tree, n, ps) for n in tree["query_nodes"]])
        assert rel_err(attn.run(q, k, v), ref) < 2e-3
        with pytest.warns(UserWarning, match="fitted on Test GPU, not on this Other GPU"):
            treeattn._warn_if_uncalibrated("Other GPU")
    finally:
        treeattn.set_auto_cost_model(None)
    assert treeattn.auto_cost_model() == builtin
    attn.plan_tree(**tree)
    assert attn.plan_summary() == builtin_plan
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "treeattn-auto-cost/1", "margin": 0, "coefficients": {"const": -1}}')
    with pytest.raises(ValueError, match="bad.json.*coefficients"):
        treeattn.set_auto_cost_model(bad)
    with pytest.raises(ValueError, match="no_such_table.json"):
        treeattn.set_auto_cost_model(tmp_path / "no_such_table.json")
    assert treeattn.auto_cost_model() == builtin, "a refused table leaves the one in use"


def test_radix_cache_refuses_bool_arrays_bytes_huge_sequences_and_names_raising_indexes():
    """Found by a bad-input sweep: torch.tensor(True) locked node 1, a bool tensor or a
    memoryview / bytearray were read as token ids, an ndim that is not an int was a
    RuntimeError (std::bad_cast), an __index__ that raises escaped as its own exception, a
    huge range was copied whole (gigabytes) before any check, NumPy ints were refused by the
    constructor, alloc(-1) / evict(-5) did not name their argument."""
    c = treeattn.RadixCache(16, 4)
    node = c.insert(list(range(8)), c.alloc(2))
    free, cached = c.num_free_pages(), c.num_cached_pages()

    class NDim:
        ndim = "x"

        def __iter__(self):
            return iter([1, 2, 3, 4])

    class RaisingIndex:
        def __index__(self):
            return 1 // 0

    for call, err, text in [
            (lambda: c.lock(torch.tensor(True)), TypeError, "node: expected an int, got torch.Tensor"),
            (lambda: c.match_prefix(torch.ones(4, dtype=torch.bool)), TypeError,
             "tokens: expected a sequence of ints or a 1-D int array, got torch.Tensor"),
            (lambda: c.match_prefix(memoryview(b"abcd")), TypeError, "got memoryview"),
            (lambda: c.match_prefix(bytearray(b"abcd")), TypeError, "got bytearray"),
            (lambda: c.match_prefix([np.True_, 1, 2, 3]), TypeError, "tokens[0]: expected an int, got bool"),
            (lambda: c.match_prefix(NDim()), ValueError, "tokens: expected a 1-D array, got ndim 'x'"),
            (lambda: c.lock(RaisingIndex()), TypeError, "node: expected an int, got "),
            (lambda: c.insert(range(2 ** 31), [0]), ValueError,
             "tokens: 2147483648 elements, more than the 64 the cache can hold"),
            (lambda: c.free(range(17)), ValueError, "pages: 17 elements, more than the 16 the cache can hold"),
            (lambda: c.alloc(-1), ValueError, "n = -1 is out of range [0, "),
            (lambda: c.evict(-5), ValueError, "num_pages = -5 is out of range [0, ")]:
        with pytest.raises(err, match=re.escape(text)):
            call()
    assert (c.num_free_pages(), c.num_cached_pages()) == (free, cached)
    c.check()
    # A match reads at most what the cache can hold: range(10**9) is not copied whole.
    assert c.match_prefix(range(10 ** 9))[:2] == (node, 8)
    assert c.match_prefix(iter(range(10 ** 9)))[:2] == (node, 8)
    assert treeattn.RadixCache(np.int64(16), np.int32(4)).num_pages == 16
    assert len(c.alloc(np.array(2))) == 2   # a 0-d integer array is an int
