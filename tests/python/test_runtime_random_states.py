"""One long-lived TreeAttention (CPU) walked through random interleavings of decode growth, forks, finishes with
page reuse, reorders, remapped pages, near-capacity and tiny trees, block tables, draft trees and refused inputs,
every run checked against an fp64 reference (tests/python/runtime_random_states.py has the driver; run it as a
script for a long soak)."""

import collections

import pytest

import runtime_random_states as rs

BIG = rs.BIG_EXT
CONFIGS = [  # seed -> the parts of the config fixed (the rest random from the seed)
    (11, dict(ps=16, H=8, Hkv=2, dtype="fp16", planner="auto", max_ext=BIG, max_queries=24, max_nodes=40)),
    (12, dict(ps=3, H=4, Hkv=1, dtype="bf16", planner="node", max_ext=64, max_queries=16, max_nodes=30)),
    (13, dict(ps=1, H=2, Hkv=2, dtype="fp16", planner="per-query", max_ext=8, max_queries=20, max_nodes=24)),
    (14, dict(ps=3, H=8, Hkv=2, dtype="bf16", planner="flatten", max_ext=BIG, max_queries=12, max_nodes=20)),
    (15, dict(ps=16, H=4, Hkv=1, dtype="bf16", planner="fasttree", max_ext=0, max_queries=10, max_nodes=16)),
]
STEPS = 130


def walk_all():
    total = collections.Counter()
    for seed, cfg in CONFIGS:
        p = rs.Probe(seed, cfg)
        total.update(p.walk(STEPS))
    return total


def test_one_runtime_through_random_states_matches_the_reference():
    total = walk_all()
    # The walk did what it is for (counts over the five runtimes).
    for kind in ["extended", "fresh", "page_reuse", "grow", "change", "remap", "big", "tiny", "op:fork", "op:finish",
                 "op:reorder", "op:rollback", "op:second_root", "bt_new", "bt_grow", "bt_fork", "tree_queries",
                 "tq_as_tree", "refused", "refused:growth_page_taken", "reused_page_in_extension", "bind", "bound_reused", "bound_refused",
                 "run:out_lse", "run:strided", "run:numpy"]:
        assert total[kind] > 0, (kind, dict(total))
    assert total["extended"] >= 50 and total["fresh"] >= 100, dict(total)
    assert sum(v for k, v in total.items() if k.startswith("refused:")) == total["refused"] >= 30, dict(total)
    assert total["bound_run"] >= 50, dict(total)


@pytest.mark.parametrize("corruption", ["drop_token", "wrong_page", "output_element", "stale_extension_counter"])
def test_the_walk_fails_when_something_is_wrong(monkeypatch, corruption):
    """The probe is not blind: a reference missing one token, one page id off, one corrupted output element, or a
    runtime that stopped extending each make the walk fail."""
    if corruption in ("drop_token", "wrong_page"):
        orig = rs.reference

        def bad_reference(q, k, v, rows, scale):
            rows = [list(r) for r in rows]
            i = max(range(len(rows)), key=lambda j: len(rows[j]))
            if rows[i]:
                if corruption == "drop_token":
                    del rows[i][len(rows[i]) // 2]
                else:  # the row's page one page further (the same slot of another page)
                    rows[i][0] = (rows[i][0] + 16 * 3) % k.shape[0]
            return orig(q, k, v, rows, scale)

        monkeypatch.setattr(rs, "reference", bad_reference)
    elif corruption == "output_element":
        orig_check = rs.Probe._check

        def bad_check(self, tag, q, out, lse, rows):
            import torch

            o = torch.as_tensor(out).clone()
            o.view(-1)[int(self.rng.integers(o.numel()))] += 0.05
            return orig_check(self, tag, q, o, lse, rows)

        monkeypatch.setattr(rs.Probe, "_check", bad_check)
    else:  # plan_stats as a runtime that never extends would report it
        orig_stats = rs.Probe._stats

        def no_extension(self):
            s = orig_stats(self)
            return dict(s, planned=s["planned"] + s["extended"], extended=0)

        monkeypatch.setattr(rs.Probe, "_stats", no_extension)
    with pytest.raises(AssertionError):
        rs.Probe(*CONFIGS[0]).walk(40)
