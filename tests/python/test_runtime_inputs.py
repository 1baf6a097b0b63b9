"""Hostile inputs to the runtime's public surface (an adversarial audit):
each is a ValueError or TypeError naming the argument and the value, never
another exception, a traceback inside the message, or a silently wrong answer.
Each case here failed before its fix."""

import json
import re
import warnings

import numpy as np
import pytest

import treeattn

torch = pytest.importorskip("torch")

H, HKV, D, PAGE, PAGES = 4, 2, 64, 4, 16
TREE = dict(parents=[-1, 0, 0], num_tokens=[5, 3, 2], page_offsets=[0, 2, 3, 4], page_ids=[0, 1, 2, 3],
            query_nodes=[1, 2])


def make(**kw):
    kw = dict(dict(device="cpu", max_queries=8, max_nodes=8, max_page_refs=32, planner="node"), **kw)
    return treeattn.TreeAttention(H, HKV, D, PAGE, PAGES, **kw)


def planned():
    attn = make()
    attn.plan_tree(**TREE)
    g = torch.Generator().manual_seed(0)
    q = torch.rand(2, H, D, generator=g).half()
    k = torch.rand(PAGES, PAGE, HKV, D, generator=g).half()
    v = torch.rand(PAGES, PAGE, HKV, D, generator=g).half()
    return attn, q, k, v


def test_constructor_refuses_a_pool_no_plan_accepts():
    # Was accepted; every plan then failed with "num_pages: ... exceed the supported pool size".
    with pytest.raises(ValueError, match=re.escape("num_pages: 2147483647 pages of 65536 tokens x 2 kv heads x 64 "
                                                   "exceed the supported pool size (2^46 elements)")):
        treeattn.TreeAttention(H, HKV, D, 65536, 2 ** 31 - 1, device="cpu")
    treeattn.TreeAttention(H, HKV, D, 256, 2 ** 31 - 1, device="cpu")  # (2^31 - 1) x 256 x 2 x 64 < 2^46


def test_constructor_planner_and_plan_options_of_the_wrong_type_name_themselves():
    # planner=None was nanobind's "incompatible function arguments" (all 18 of them listed);
    # plan_options=[...] an AttributeError ('list' object has no attribute 'items').
    for planner in (None, 3, b"node"):
        with pytest.raises(TypeError, match=re.escape(f"planner: expected a planner name (str), got {planner!r}")):
            make(planner=planner)
    with pytest.raises(TypeError, match="plan_options: expected a mapping of option names to numbers, got list"):
        make(plan_options=[("tile_rows", 16)])


def test_plan_index_arrays_numpy_or_torch_cannot_take_name_the_argument():
    attn = make()
    # A ragged list: NumPy's "setting an array element with a sequence..." without the argument's name.
    with pytest.raises(ValueError, match=r"^block_tables: not an integer array \(setting an array element"):
        attn.plan_block_tables([[0, 1, 2], [0, 1]], [9, 10])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested and quantized tensors warn that they are prototypes / deprecated
        base = torch.tensor(TREE["page_ids"], dtype=torch.int32)
        cases = [  # were torch's own TypeError / RuntimeError, naming neither the argument nor the tensor
            (base.to_sparse(), ValueError, "page_ids: expected a dense tensor, got a torch.sparse_coo one"),
            (torch.nested.nested_tensor([base, base]), ValueError, "page_ids: expected a dense tensor, got a nested one"),
            (torch.quantize_per_tensor(base.float(), 1.0, 0, torch.qint32), TypeError,
             "page_ids: expected integers, got torch.qint32"),
        ]
        for value, error, text in cases:
            with pytest.raises(error, match=re.escape(text)):
                attn.plan_tree(**{**TREE, "page_ids": value})
    # A negated view (neg bit) of integers was "Can't call numpy() on Tensor that has negative bit set": its values.
    neg = (-base)._neg_view()
    attn.plan_tree(**{**TREE, "page_ids": neg})
    assert attn.plan_summary()["nodes"] == 3


def test_block_tables_shape_past_int32_is_named_as_it_is():
    # Was "block_tables shape [-2147483648, 0] must be positive": the dimension wrapped to int32.
    attn = make()
    with pytest.raises(ValueError, match=re.escape("block_tables: shape [2147483648, 0] is out of range")):
        attn.plan_block_tables(np.zeros((2 ** 31, 0), np.int32), [9, 10])
    with pytest.raises(ValueError, match=re.escape("block_tables: shape [0, 4294967298] is out of range")):
        attn.plan_block_tables(np.zeros((0, 2 ** 32 + 2), np.int32), np.zeros(0, np.int32))


def test_negated_torch_views_are_refused_not_read_with_the_wrong_sign():
    # A tensor with PyTorch's neg bit (the .imag of a conj()ed complex-half tensor) holds the negation of
    # its memory: q, k and v were read raw and out written raw, a silently wrong answer.
    attn, q, k, v = planned()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
        z = torch.complex(q.float(), q.float()).to(torch.chalf)
    assert z.conj().imag.is_neg() and z.conj().imag.dtype == torch.float16  # reachable without private API
    out = torch.zeros_like(q)
    cases = [("q", dict(q=(-q)._neg_view())), ("k_pool", dict(k=(-k)._neg_view())),
             ("v_pool", dict(v=(-v)._neg_view())), ("out", dict(out=torch.zeros_like(q)._neg_view()))]
    for name, change in cases:
        a = dict(q=q, k=k, v=v, out=out, **{})
        a.update(change)
        text = f"{name}: a tensor with its negative bit set"
        with pytest.raises(ValueError, match=re.escape(text)):
            attn.run(a["q"], a["k"], a["v"], a["out"])
        with pytest.raises(ValueError, match=re.escape(text)):
            attn.bind(a["q"], a["k"], a["v"], a["out"])
    assert not out.any()
    assert torch.equal(attn.run((-q)._neg_view().resolve_neg(), k, v), attn.run(q, k, v))


def test_run_tensors_without_memory_name_the_argument():
    attn, q, k, v = planned()
    zero = getattr(torch, "_efficientzerotensor", None)
    if zero is None:
        pytest.skip("no torch._efficientzerotensor")
    out = torch.zeros_like(q)
    # q, k, out: "tree attention: run(): null tensor pointer" (which one?); lse: taken as "no lse", never written.
    for name, change in [("q", dict(q=zero((2, H, D), dtype=torch.float16))),
                         ("k_pool", dict(k=zero((PAGES, PAGE, HKV, D), dtype=torch.float16))),
                         ("out", dict(out=zero((2, H, D), dtype=torch.float16)))]:
        a = dict(q=q, k=k, v=v, out=out)
        a.update(change)
        with pytest.raises(ValueError, match=re.escape(f"{name}: its data pointer is null")):
            attn.run(a["q"], a["k"], a["v"], a["out"])
    with pytest.raises(ValueError, match=re.escape("lse: its data pointer is null")):
        attn.run(q, k, v, out, lse=zero((2, H), dtype=torch.float32))


def test_run_tensors_whose_shape_cannot_be_read_name_the_argument():
    attn, q, k, v = planned()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([q[0], q[1]])
        jagged = torch.nested.nested_tensor([q[0], q[1]], layout=torch.jagged)
    # Without out (or with return_lse): PyTorch's RuntimeError from allocating out like q.
    for call in (lambda: attn.run(nested, k, v), lambda: attn.run(nested, k, v, torch.zeros_like(q), return_lse=True)):
        with pytest.raises(ValueError, match=r"^q: cannot read the tensor's shape \(RuntimeError: "):
            call()
    # A jagged tensor's shape holds a torch.SymInt: PyTorch's RuntimeError from torch.empty.
    with pytest.raises(ValueError, match=re.escape("q: cannot allocate out like it: shape [2, j1, 64] is not of ints")):
        attn.run(jagged, k, v)
    # With out: the message held PyTorch's whole Python traceback ("(Traceback (most recent call last): ...").
    with pytest.raises(ValueError, match=r"^q: cannot read the tensor's shape \(\w+: ") as e:
        attn.run(jagged, k, v, torch.zeros_like(q))
    assert "Traceback" not in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_run_flags_and_numbers_of_the_wrong_kind_are_refused():
    attn, q, k, v = planned()
    ref = attn.run(q, k, v)
    # scale=True ran with scale 1.0; stream=1.5 / True ran on "stream 1".
    for name in ("scale", "k_scale", "v_scale"):
        with pytest.raises(TypeError, match=re.escape(f"{name}: expected a number, got True")):
            attn.run(q, k, v, **{name: True})
    for stream in (1.5, True):
        with pytest.raises(TypeError, match=re.escape(f"stream: expected a stream handle (an int), got {stream!r}")):
            attn.run(q, k, v, stream=stream)
        with pytest.raises(TypeError, match=re.escape("stream: expected a stream handle (an int)")):
            attn.plan_tree(**TREE, stream=stream)
    # return_lse=<an array>: NumPy's "The truth value of an array ... is ambiguous", not naming it.
    with pytest.raises(TypeError, match=re.escape("return_lse: expected a bool, got array([1, 2])")):
        attn.run(q, k, v, return_lse=np.array([1, 2]))
    assert torch.equal(attn.run(q, k, v, scale=np.float32(D ** -0.5), stream=0), ref)  # numbers, ints: as before


def test_an_empty_pool_is_named_by_its_shape_not_its_strides():
    # Was "k_pool: the last two dimensions must be dense (strides 64, 1), got strides 0, 0" (NumPy exports
    # an empty array's strides as 0): the pool has no pages.
    attn = make()
    attn.plan_tree(**TREE)
    q = np.zeros((2, H, D), np.float16)
    empty = np.zeros((0, PAGE, HKV, D), np.float16)
    with pytest.raises(ValueError, match=re.escape("k_pool: shape [0, 4, 2, 64] must be [>= num_pages = 16")):
        attn.run(q, empty, empty)
    with pytest.raises(ValueError, match=re.escape("q: 0 queries, the plan has 2")):
        attn.run(np.zeros((0, H, D), np.float16), np.zeros((PAGES, PAGE, HKV, D), np.float16),
                 np.zeros((PAGES, PAGE, HKV, D), np.float16), out=q)


def test_a_view_past_its_shrunk_storage_is_refused_not_read_or_written():
    # untyped_storage().resize_(n) after the view was made (PyTorch checks nothing there): out and lse were
    # written past their storage (a bus error or a corrupted heap), q and the pools read past theirs.
    attn, q, k, v = planned()
    ref = attn.run(q, k, v)
    for name in ("q", "k_pool", "v_pool", "out", "lse"):
        a = dict(q=q.clone(), k_pool=k.clone(), v_pool=v.clone(), out=torch.zeros_like(q),
                 lse=torch.zeros(2, H, dtype=torch.float32))
        a[name].untyped_storage().resize_(16)
        for call in (lambda: attn.run(a["q"], a["k_pool"], a["v_pool"], a["out"], lse=a["lse"]),
                     lambda: attn.bind(a["q"], a["k_pool"], a["v_pool"], a["out"], lse=a["lse"])):
            with pytest.raises(ValueError, match=rf"^{name}: the view's elements span bytes \[0, \d+\) of its "
                                                 r"storage, which holds 16 \(a storage resized"):
                call()
    # A view inside a larger storage (a slice of a layer-major cache) is still taken.
    big = torch.zeros(3, *q.shape, dtype=q.dtype)
    assert torch.equal(attn.run(q, k, v, big[1]), ref)


def test_numpy_and_torch_bools_are_not_numbers_streams_or_flags_strings_are_not_streams():
    from fractions import Fraction

    attn, q, k, v = planned()
    ref = attn.run(q, k, v)
    # np.True_ / torch.tensor(True) ran with scale 1.0 (Python's True was refused).
    for name in ("scale", "k_scale", "v_scale"):
        for b in (np.True_, torch.tensor(True)):
            with pytest.raises(TypeError, match=re.escape(f"{name}: expected a number, got {b!r}")):
                attn.run(q, k, v, **{name: b})
    with pytest.raises(ValueError, match=re.escape("scale = 11481306952742545242... is not representable as a "
                                                   "float32 (it overflows)")):
        attn.run(q, k, v, scale=2 ** 2000)
    # '7', b'7', 1.5 as a NumPy or PyTorch number, a Fraction: taken as stream handles 7 and 1.
    for stream in ("7", b"7", np.float32(1.5), np.True_, Fraction(3, 2), torch.tensor(1.5), torch.tensor(True)):
        with pytest.raises(TypeError, match=re.escape(f"stream: expected a stream handle (an int), got {stream!r}")):
            attn.run(q, k, v, stream=stream)
        with pytest.raises(TypeError, match=re.escape("stream: expected a stream handle (an int)")):
            attn.plan_tree(**TREE, stream=stream)
    assert torch.equal(attn.run(q, k, v, stream=np.int64(0)), ref)
    assert torch.equal(attn.run(q, k, v, stream=torch.tensor(0)), ref)
    # return_lse='no' / [] read as true / false by their length.
    for flag in ("no", [], 2):
        with pytest.raises(TypeError, match=re.escape(f"return_lse: expected a bool, got {flag!r}")):
            attn.run(q, k, v, return_lse=flag)
    assert isinstance(attn.run(q, k, v, return_lse=np.True_), tuple)
    for flag in ("no", np.array([1, 2])):
        with pytest.raises(TypeError, match=re.escape("l2_persistent_plan: expected a bool, got ")):
            make(l2_persistent_plan=flag)
    attn.graph_launches = np.int64(0)  # NumPy ints as elsewhere (CPU: only 0)
    assert attn.graph_launches == 0


def test_text_arguments_with_nul_or_lone_surrogates_and_cost_models_of_bad_bytes_name_themselves(tmp_path):
    # A path with a NUL opened the file named by its prefix; a lone surrogate was nanobind's
    # "incompatible function arguments"; a cost-model file with a non-UTF-8 byte a UnicodeDecodeError.
    good = tmp_path / "model.json"
    good.write_text(json.dumps(treeattn.auto_cost_model()))
    treeattn.set_auto_cost_model(str(good))  # the file itself is fine
    for path in (str(good) + "\x00junk", "/tmp/\udcff.json"):
        with pytest.raises(ValueError, match=r"^path: "):
            treeattn.set_auto_cost_model(path)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"device": "x", "coefficients": \xff}')
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        treeattn.set_auto_cost_model(str(bad))
    treeattn.set_auto_cost_model(None)
    with pytest.raises(ValueError, match=re.escape("planner: 'node\\x00x' contains a NUL character")):
        make(planner="node\x00x")
    with pytest.raises(ValueError, match=re.escape("planner: '\\udcff' is not valid text (a lone surrogate)")):
        make(planner="\udcff")
    with pytest.raises(ValueError, match=re.escape("plan_options: '\\udcff' is not valid text")):
        make(plan_options={"\udcff": 1})


def test_run_op_checks_what_run_checks():
    from treeattn import torch_ops

    if not torch_ops.available:
        pytest.skip("torch.library.custom_op needs PyTorch >= 2.4")
    attn, q, k, v = planned()
    ref = attn.run(q, k, v)
    out = torch.zeros_like(q)
    # A meta tensor took the op to its fake kernel: nothing computed, no error.
    for name, a in (("q", (q.to("meta"), k, v, out)), ("k_pool", (q, k.to("meta"), v, out)),
                    ("out", (q, k, v, out.to("meta")))):
        with pytest.raises(ValueError, match=re.escape(f"{name}: expected a tensor on cpu (the TreeAttention's "
                                                       "device), got one on meta")):
            attn.run_op(*a)
    # A negated out was written through a temporary, then PyTorch's "Expected Tensor but got None".
    with pytest.raises(ValueError, match=re.escape("out: a tensor with its negative or conjugate bit set")):
        attn.run_op(q, k, v, torch.zeros_like(q)._neg_view())
    # Scales through a bare float(): True accepted as 1.0, 'abc' / arrays / 2**2000 not naming the argument.
    for value, err, text in ((True, TypeError, "scale: expected a number, got True"),
                             ("abc", TypeError, "scale: expected a number, got 'abc'"),
                             (np.array([1.0, 2.0]), TypeError, "scale: expected a number, got array([1., 2.])"),
                             (2 ** 2000, ValueError, "scale = 11481306952742545242... is not representable")):
        with pytest.raises(err, match=re.escape(text)):
            attn.run_op(q, k, v, out, scale=value)
    assert not out.any()
    assert torch.equal(attn.run_op(q, k, v, out), ref)
