"""GPU-only engine checks (skipped without CUDA): CUDA-graph decode equals eager decode, and
the treeattn backend (when built) matches the torch reference on a tree program."""
import pytest
import torch

from treeattn.engine import build_engine, load_model, make_program, run_program

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def need_treeattn():
    try:
        from treeattn import TreeAttention  # noqa: F401
    except ImportError:
        pytest.skip("treeattn extension not built")

SPEC = "shared:prompt=37,branches=5,question=3,gen=12"


def logits_of(attention, graphs):
    model = load_model("random:tiny", device="cuda", dtype="bf16")
    engine = build_engine(model, attention, "auto", page_size=16, num_pages=64, max_batch=8,
                          graphs=graphs)
    program = make_program(SPEC, model.cfg.vocab_size)
    return run_program(engine, program, record_logits=True).logits


def test_graphs_match_eager():
    need_treeattn()
    for a, b in zip(logits_of("auto", False), logits_of("auto", True)):
        assert torch.allclose(a, b, atol=1e-3)


@pytest.mark.parametrize("planner", ["auto", "per-query"])
def test_treeattn_matches_torch_ref(planner):
    need_treeattn()
    for a, b in zip(logits_of("torch-ref", False), logits_of(planner, False)):
        assert (a - b).norm() / a.norm() < 2e-2
