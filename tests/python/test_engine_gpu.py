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


def test_compiled_ops_match_eager():
    """Each torch.compile'd op against its eager version on CUDA, fp32 (the same math up to
    reduction order) and bf16 (rounding of intermediates may differ: a loose bound)."""
    from treeattn.engine import ops
    if not ops.compile_available()[0]:
        pytest.skip(ops.compile_available()[1])
    eager, compiled = ops.EAGER, ops.compiled_ops()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for t in (1, 7, 64):   # several shapes: the compiled ops go dynamic after the second
            r = lambda *shape: torch.randn(*shape, device="cuda", generator=gen).to(dtype)
            x, res, w = r(t, 256), r(t, 256), r(256)
            qkv, cos, sin = r(t, (8 + 2 * 2) * 32), r(t, 32), r(t, 32)
            gate_up = r(t, 2 * 96)
            cases = [("rms_norm", (x, w, 1e-5)), ("add_rms_norm", (x, res, w, 1e-5)),
                     ("rope_qkv", (qkv, cos, sin, 8, 2, 32)), ("silu_mul", (gate_up,))]
            for name, args in cases:
                want, got = getattr(eager, name)(*args), getattr(compiled, name)(*args)
                for a, b in zip(want if isinstance(want, tuple) else (want,),
                                got if isinstance(got, tuple) else (got,)):
                    assert a.shape == b.shape and a.dtype == b.dtype, name
                    torch.testing.assert_close(b, a, rtol=tol, atol=tol, msg=f"{name} {dtype} t={t}")


def test_compiled_engine_matches_eager_engine():
    """A whole program with compiled ops and CUDA graphs, fp32 model with the torch reference
    attention and bf16 with treeattn: logits of every step against the eager engine's."""
    need_treeattn()
    from treeattn.engine import ops
    if not ops.compile_available()[0]:
        pytest.skip(ops.compile_available()[1])

    def run(compiled, dtype, attention, graphs):
        model = load_model("random:tiny", device="cuda", dtype=dtype)
        model.use_ops(ops.compiled_ops() if compiled else ops.EAGER)
        engine = build_engine(model, attention, "auto", page_size=16, num_pages=64, max_batch=8,
                              graphs=graphs)
        return run_program(engine, make_program(SPEC, model.cfg.vocab_size),
                           record_logits=True).logits

    for dtype, attention, graphs, tol in (("fp32", "torch-ref", False, 1e-4),
                                          ("bf16", "auto", True, 5e-2)):
        for a, b in zip(run(False, dtype, attention, False), run(True, dtype, attention, graphs)):
            err = (a - b).abs().max().item()
            assert err <= tol, f"{dtype} {attention}: max |compiled - eager| = {err}"
