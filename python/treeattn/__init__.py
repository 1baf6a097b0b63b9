"""treeattn: prefix-aware attention for tree-structured LLM decoding.

One object per engine, made once with the engine's limits; ``plan_*`` once per
decode step (outside CUDA graph capture); ``run`` once per layer (inside it).
Tensors go in and out through DLPack: PyTorch, CuPy and JAX arrays on CUDA;
NumPy arrays and CPU PyTorch tensors on the CPU, where the same calls run the
CPU executor.

    attn = treeattn.TreeAttention(32, 8, 128, page_size=16, num_pages=4096,
                                  dtype="bf16", device="cuda")
    attn.plan_tree(parents, num_tokens, page_offsets, page_ids, query_nodes)
    for layer in range(num_layers):
        out = attn.run(q[layer], k_pool[layer], v_pool[layer])

Shapes ("NHD"): q, out ``[num_queries, num_qo_heads, head_dim]``; k_pool,
v_pool ``[num_pages, page_size, num_kv_heads, head_dim]``. The outer
dimensions may be strided (views into a layer-major or K/V-interleaved cache);
the last two must be dense.
"""

from __future__ import annotations

import itertools
import numbers
import weakref
from collections.abc import Mapping as _Mapping
from typing import Any, Mapping, Optional

import numpy as np

from . import _treeattn

__all__ = ["TreeAttention", "BoundRun", "RadixCache", "cuda_built", "planners", "set_auto_cost_model",
           "auto_cost_model"]

# The page-granular radix tree over token ids and its page pool (C++): see
# include/treeattn/cache.hpp. Page ids it hands out are what plan_tree takes.
RadixCache = _treeattn.RadixCache

cuda_built: bool = _treeattn.cuda_built

# [(name, description)] of the planners ``TreeAttention(planner=...)`` takes.
planners = _treeattn.planners

_DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise TypeError(f"dtype: expected float16 or bfloat16, got {dtype!r}")
    return _DTYPES[name]


def _kv_dtype_name(kv_dtype: Any, dtype: str) -> str:
    """The native kv_dtype argument: "" (the pools are of the dtype) or "fp8_e4m3"."""
    if kv_dtype is None:
        return ""
    name = str(kv_dtype).replace("torch.", "")
    if name in ("fp8_e4m3", "float8_e4m3fn", "fp8"):
        return "fp8_e4m3"
    if _DTYPES.get(name) == dtype:
        return ""
    raise TypeError(f"kv_dtype: expected None, the dtype ({dtype}) or fp8_e4m3 (torch.float8_e4m3fn), got {kv_dtype!r}")


def _first_slots(first_slots: Any, parents: np.ndarray) -> Optional[np.ndarray]:
    """first_slots as _index makes it, None when not given. The extension reads
    an empty array as "not given": one given empty for a tree is refused here."""
    if first_slots is None:
        return None
    fs = _index("first_slots", first_slots)
    if fs.size == 0 and parents.size != 0:
        raise ValueError(f"first_slots: 0 entries for {parents.size} nodes (pass None for all-zero first slots)")
    return fs


def _require_dense(name: str, x: Any) -> None:
    """ValueError naming ``name`` unless PyTorch tensor x is dense (not nested, sparse, ...)."""
    if getattr(x, "is_nested", False) or str(x.layout) != "torch.strided":
        raise ValueError(f"{name}: expected a dense tensor, got a {'nested' if x.is_nested else x.layout} one")


def _index(name: str, x: Any, dtype=np.int32, ndim: int = 1) -> np.ndarray:
    """A contiguous host integer array from a list, NumPy array or CPU tensor."""
    if type(x) is np.ndarray and x.dtype == dtype and x.ndim == ndim and x.flags.c_contiguous:
        return x  # already what the extension takes (the per-step case): nothing to convert or range-check
    if x is None:
        raise ValueError(f"{name}: required")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        if x.is_floating_point():
            raise TypeError(f"{name}: expected integers, got {x.dtype}")
        if getattr(x, "is_meta", False):
            raise ValueError(f"{name}: a meta tensor holds no values")
        _require_dense(name, x)
        try:  # a negated view (its neg bit set) is read as its values
            x = x.detach().cpu().resolve_neg().numpy()
        except (RuntimeError, TypeError) as e:  # a quantized dtype, ...
            raise TypeError(f"{name}: expected integers, got {x.dtype} ({str(e).splitlines()[0]})") from None
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:  # a ragged list, or an object NumPy cannot take
        raise type(e)(f"{name}: not an integer array ({str(e).splitlines()[0]})") from None
    if a.size == 0:
        a = a.astype(dtype)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {a.shape}")
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise ValueError(f"{name}: values [{a.min()}, {a.max()}] do not fit {np.dtype(dtype).name}")
    return np.ascontiguousarray(a, dtype=dtype)


def _int_arg(name: str, value: Any, lo: int = -(1 << 31), hi: int = (1 << 31) - 1) -> int:
    """An int argument of the constructor, in the range of its C++ field (the
    C++ constructor then names the range that field accepts)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} = {value} is out of range [{lo}, {hi}]")
    return int(value)


def _text(name: str, value: str) -> str:
    """A str argument the extension takes as UTF-8 text: no NUL (a C string
    would end there) and no lone surrogate (not encodable)."""
    if "\x00" in value:
        raise ValueError(f"{name}: {value!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name}: {value!r} is not valid text (a lone surrogate)") from None
    return value


def _flag(name: str, value: Any) -> bool:
    """A bool argument: Python's or NumPy's, or 0 or 1 (a string or an array
    would read as true by its length)."""
    if isinstance(value, (bool, np.bool_)) or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {value!r}")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _torch_stream_source(device: int):
    """(fn, arg): ``fn(arg)`` (``fn()`` when arg is None) returns PyTorch's
    current CUDA stream handle on CUDA device ``device`` (the
    TreeAttention's: its buffers live there), through the raw accessor where
    this PyTorch has it (~20x cheaper than current_stream()). run() calls it
    from C++."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw, device
    return (lambda: torch.cuda.current_stream(device).cuda_stream), None


def _parse_device(device: Any) -> "tuple[str, int]":
    """("cuda", index) or ("cpu", -1) from "cuda", "cuda:1", "cpu" or a
    torch.device; index -1: the current CUDA device."""
    text = str(device)
    kind, sep, index = text.partition(":")
    if kind not in ("cuda", "cpu") or (sep and (kind == "cpu" or not index.isdigit())):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:<index>', got {text!r}")
    return kind, int(index) if index else -1


# TreeAttention objects by handle, for the PyTorch custom op (torch_ops.py),
# which can take an int but not an arbitrary object; weak, so that a handle
# does not keep its TreeAttention alive.
_BY_HANDLE: "weakref.WeakValueDictionary[int, TreeAttention]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def _alloc_run_output(q: Any, num_qo_heads: int, lse: bool) -> Any:
    """run()'s out (q's shape and dtype) or, with ``lse``, its lse (float32
    ``[num_queries, num_qo_heads]``), on q's device, where run() is given none."""
    try:  # a nested (ragged) tensor has no shape to read
        shape = tuple(q.shape)
    except AttributeError:
        raise TypeError(f"q: expected a tensor (PyTorch, or anything with DLPack), got {type(q).__name__}") from None
    except Exception as e:
        raise ValueError(f"q: cannot read the tensor's shape ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if len(shape) != 3:
        raise ValueError(f"q: expected 3 dimensions, got shape {list(shape)}")
    if not all(type(d) is int for d in shape):  # a jagged tensor's ragged dimension (a torch.SymInt)
        raise ValueError(f"q: cannot allocate out like it: shape {list(shape)} is not of ints (a nested tensor?)")
    if lse:
        return _empty_like(q, (shape[0], num_qo_heads), float32=True)
    return _empty_like(q, shape)


def _empty_like(x: Any, shape, float32: bool = False) -> Any:
    if _is_torch(x):
        import torch

        return torch.empty(shape, dtype=torch.float32 if float32 else x.dtype, device=x.device)
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy.empty(shape, dtype=cupy.float32 if float32 else x.dtype)
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype=np.float32 if float32 else x.dtype)
    raise TypeError(f"q: expected a tensor (PyTorch, CuPy or NumPy where out is not given), got "
                    f"{type(x).__name__}; or pass out")


def set_auto_cost_model(path: Optional[str]) -> None:
    """Makes the cost model in ``path`` the one the ``auto`` planner uses, in
    every TreeAttention of this process from its next plan on; None restores
    the built-in (H100) table.

    A table fitted on this GPU comes from ``treeattn calibrate --auto --out
    FILE`` (about 30 s on an H100; docs/planners.md). A missing or malformed
    file raises ValueError naming the path and the field.
    """
    _treeattn._set_auto_cost_model(None if path is None else _text("path", str(path)))


def auto_cost_model() -> dict:
    """The ``auto`` planner's cost model in use: device, date, commit, source,
    fit, margin, shape_margins and coefficients (the file format of ``set_auto_cost_model``)."""
    import json

    return json.loads(_treeattn._auto_cost_model())


_warned_devices: set = set()


def _warn_if_uncalibrated(device_name: str) -> None:
    """Once per GPU model: auto's table was fitted on another GPU."""
    fitted = auto_cost_model().get("device", "")
    if fitted and device_name and device_name != fitted and device_name not in _warned_devices:
        _warned_devices.add(device_name)
        import warnings

        warnings.warn(f"treeattn: the auto planner's cost model was fitted on {fitted}, not on this {device_name}; "
                      "`treeattn calibrate --auto --out FILE` fits one here and treeattn.set_auto_cost_model(FILE) "
                      "uses it", stacklevel=3)


class TreeAttention:
    """Attention over a prefix tree of paged KV, planned per step, run per layer.

    Args:
        num_qo_heads, num_kv_heads, head_dim: the attention shape (GQA when
            num_qo_heads > num_kv_heads; head_dim 64, 128 or 256).
        page_size: tokens per page of the KV pools.
        num_pages: pages of the pools ``run`` will be given (page ids must be below).
        dtype: "fp16"/"bf16" or a torch dtype; q and out use it, and the
            K/V pools unless kv_dtype says otherwise.
        kv_dtype: None (the pools are of ``dtype``) or "fp8_e4m3" /
            ``torch.float8_e4m3fn``: fp8 pools (torch.float8_e4m3fn tensors, or
            uint8 tensors/arrays holding their bytes), dequantised as stored
            value x ``k_scale`` (``v_scale``), the per-tensor scales ``run``
            takes, as vLLM's fp8 KV cache stores them. Half the bytes of a
            16-bit pool to read.
        device: "cuda" (the current CUDA device), "cuda:<index>", a
            torch.device, or "cpu". plan and run switch to that device for
            their CUDA calls and back; tensors on another device are refused.
        max_queries, max_nodes, max_page_refs: capacities; every device buffer
            is sized by them once. A step beyond one raises ValueError naming it.
        planner: "auto" (default), "node", "per-query", ... (``treeattn workloads``
            lists them).
        plan_options: planner options by name, as ``treeattn --plan-opt
            KEY=NUMBER`` takes them: ``ctas_per_sm``, ``chunk_tokens``,
            ``min_split_tokens`` or a planner's knob (node: ``split_tokens``,
            ``tile_rows``, ...; docs/planners.md). An unknown key or a value
            out of range raises ValueError naming it. Options that fix a
            choice of node's keep ``auto`` from changing it.
        max_extension_tokens: a ``plan_tree`` step whose tree is the last one
            grown at childless nodes (a decode step: the same nodes, parents
            and queries; more tokens, pages appended) extends the last plan
            instead of planning afresh, until a unit would hold more than this
            many tokens beyond its plan; 0: plan every step afresh. The
            growth is checked as a fresh tree would be; the extended plan is
            valid by construction (``plan_stats`` counts both kinds).
        l2_persistent_plan: CUDA: keep the plan's device arrays (descriptors,
            entries, page ids) in the L2 set-aside for persisting accesses,
            so that every layer's ``run`` finds them in L2 although the
            model's weight GEMMs streamed through it since: 2-6 % off small,
            latency-bound trees (docs/cuda.md, "Plan arrays in L2"). Raises
            the device-wide persisting L2 limit (``cudaLimitPersistingL2CacheSize``)
            to the plan buffer's size; ignored on the CPU.
    """

    def __init__(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, num_pages: int, *,
                 dtype: Any = "fp16", kv_dtype: Any = None, device: str = "cuda", max_queries: int = 256,
                 max_nodes: int = 4096,
                 max_page_refs: int = 65536, planner: str = "auto", num_sms: Optional[int] = None,
                 cpu_threads: int = 0, max_extension_tokens: int = 64, l2_persistent_plan: bool = False,
                 plan_options: Optional[Mapping[str, float]] = None):
        int32_max, int64_max = (1 << 31) - 1, (1 << 63) - 1
        num_qo_heads, num_kv_heads, head_dim, page_size = (
            _int_arg(n, v) for n, v in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads),
                                        ("head_dim", head_dim), ("page_size", page_size)))
        num_pages = _int_arg("num_pages", num_pages, -int64_max, int64_max)
        max_page_refs = _int_arg("max_page_refs", max_page_refs, -int64_max, int64_max)
        max_queries, max_nodes, cpu_threads, max_extension_tokens = (
            _int_arg(n, v) for n, v in (("max_queries", max_queries), ("max_nodes", max_nodes),
                                        ("cpu_threads", cpu_threads), ("max_extension_tokens", max_extension_tokens)))
        if num_sms is not None:
            num_sms = _int_arg("num_sms", num_sms, 1, int32_max)
        if not isinstance(planner, str):
            raise TypeError(f"planner: expected a planner name (str), got {planner!r}")
        _text("planner", planner)
        if plan_options is not None and not isinstance(plan_options, _Mapping):
            raise TypeError(f"plan_options: expected a mapping of option names to numbers, got "
                            f"{type(plan_options).__name__}")
        options = {}
        for key, value in (plan_options or {}).items():
            if not isinstance(key, str):
                raise TypeError(f"plan_options: keys are option names (str), got {key!r}")
            _text("plan_options", key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"plan_options[{key!r}]: expected a number, got {value!r}")
            options[key] = float(value)
        device, device_index = _parse_device(device)
        if device == "cuda" and not cuda_built:
            raise ValueError("device: 'cuda' needs a treeattn built with CUDA (this one was built without nvcc)")
        torch_gpus = 0  # CUDA devices PyTorch sees (0: no PyTorch)
        if device == "cuda":
            try:
                import torch

                torch_gpus = torch.cuda.device_count()  # 0 with a CPU-only PyTorch: the C++ defaults
                if device_index < 0 and torch_gpus > 0:
                    device_index = torch.cuda.current_device()
                if device_index < torch_gpus:
                    props = torch.cuda.get_device_properties(device_index)
                    if num_sms is None:
                        num_sms = props.multi_processor_count
                    if planner == "auto":
                        _warn_if_uncalibrated(props.name)
            except ImportError:  # no torch: the C++ defaults (the current device, 132 SMs)
                pass
        self.device = device
        self.dtype = _dtype_name(dtype)
        kv_native = _kv_dtype_name(kv_dtype, self.dtype)
        self.kv_dtype = kv_native or self.dtype
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.num_pages = page_size, num_pages
        self._impl = _treeattn._TreeAttention(num_qo_heads, num_kv_heads, head_dim, page_size, num_pages,
                                              self.dtype, kv_native,
                                              device, max_queries, max_nodes, max_page_refs, planner,
                                              num_sms or 0, cpu_threads, max_extension_tokens, device_index,
                                              _flag("l2_persistent_plan", l2_persistent_plan), options)
        self.device_index = self._impl.device_index  # -1 on the cpu
        stream_fn, stream_arg = None, None  # None: the default stream unless stream= is given (CPU; no PyTorch)
        if device == "cuda" and torch_gpus > 0:
            stream_fn, stream_arg = _torch_stream_source(self.device_index)
        self._stream_fn, self._stream_arg = stream_fn, stream_arg
        # run()'s C++ entry: reads and checks the tensors (PyTorch through a few
        # attribute reads, anything else through DLPack) and takes the stream
        # from the source above when none is given, in one call.
        self._run = _treeattn._Runner(self._impl, stream_fn, stream_arg, torch_gpus > 1, _alloc_run_output)
        if type(self).run is TreeAttention.run:  # a subclass's own run() stays in force
            # The per-layer call straight into C++, without run()'s Python
            # frame (~0.5-1 us a call); run() below documents it and calls it.
            self.run = self._run.call
        self.op_handle = next(_HANDLES)  # this object in torch.ops.treeattn.run (run_op)
        _BY_HANDLE[self.op_handle] = self

    # -- planning (host; once per decode step, outside graph capture) ----------
    def _stream(self, stream: Any) -> Any:
        """plan_*'s stream: an explicit one as given (the extension reads its
        handle as run() does), else PyTorch's current stream, else 0."""
        if stream is not None:
            return stream
        if self._stream_fn is None:
            return 0
        return self._stream_fn() if self._stream_arg is None else self._stream_fn(self._stream_arg)

    def plan_tree(self, parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots=None,
                  stream: Optional[int] = None) -> None:
        """Plans a step from an explicit tree (as a radix cache holds it).

        Node v has ``num_tokens[v]`` tokens in pages ``page_ids[page_offsets[v]:
        page_offsets[v+1]]`` under ``parents[v]`` (-1: a root); query i attends
        to the path root..``query_nodes[i]``. ``first_slots[v]`` (optional) is
        the slot of node v's first token in its first page (0: page-aligned).
        """
        p = _index("parents", parents)
        self._impl.plan_tree(p, _index("num_tokens", num_tokens), _index("page_offsets", page_offsets),
                             _index("page_ids", page_ids), _index("query_nodes", query_nodes),
                             _first_slots(first_slots, p), self._stream(stream))

    def plan_block_tables(self, block_tables, seq_lens, stream: Optional[int] = None) -> None:
        """Plans a step from vLLM-style block tables ``[batch, width]`` and
        ``seq_lens [batch]``: equal leading page ids are a shared prefix; one
        query per sequence."""
        self._impl.plan_block_tables(_index("block_tables", block_tables, ndim=2), _index("seq_lens", seq_lens),
                                     self._stream(stream))

    def plan_tree_queries(self, parents, num_tokens, page_offsets, page_ids, query_nodes, draft_nodes,
                          draft_parents, draft_rows, first_slots=None, stream: Optional[int] = None) -> None:
        """Plans a step whose queries include speculative draft tokens.

        Draft i is one token whose KV is at pool row ``draft_rows[i]`` (page *
        page_size + slot), a child of draft ``draft_parents[i]`` (an earlier
        draft) or, when that is -1, of tree node ``draft_nodes[i]``; its query
        attends to the node's path, its draft ancestors and itself. Queries are
        ``query_nodes`` first, then the drafts in order.
        """
        p = _index("parents", parents)
        self._impl.plan_tree_queries(p, _index("num_tokens", num_tokens), _index("page_offsets", page_offsets),
                                     _index("page_ids", page_ids), _index("query_nodes", query_nodes),
                                     _first_slots(first_slots, p), _index("draft_nodes", draft_nodes),
                                     _index("draft_parents", draft_parents),
                                     _index("draft_rows", draft_rows, dtype=np.int64), self._stream(stream))

    # -- running (device; once per layer, may be captured in a CUDA graph) -----
    def run(self, q, k_pool, v_pool, out=None, *, return_lse: bool = False, lse=None, scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None, stream: Optional[int] = None):
        """Attention of the planned queries. Returns ``out`` (allocated like q
        when not given), or ``(out, lse)`` with ``return_lse`` (lse: float32
        ``[num_queries, num_qo_heads]``, natural log, for merging with another
        attention part by the log-sum-exp rule). ``k_scale`` / ``v_scale``
        (default 1): K = stored K x k_scale, V = stored V x v_scale (fp8
        pools' per-tensor scales). Launch only on CUDA: no allocation when
        ``out`` (and ``lse``) are given. On an instance, ``attn.run`` is the
        C++ entry this calls (the same arguments, no Python frame)."""
        return self._run.call(q, k_pool, v_pool, out, return_lse=return_lse, lse=lse, scale=scale, k_scale=k_scale,
                              v_scale=v_scale, stream=stream)

    def bind(self, q, k_pool, v_pool, out, *, lse=None, scale: Optional[float] = None,
             k_scale: Optional[float] = None, v_scale: Optional[float] = None) -> "BoundRun":
        """run() with these tensors checked once: the returned callable launches
        with no per-call tensor checks, for engines that run eagerly with static
        buffers. It stays valid across plans with the same number of queries
        (ValueError otherwise); it keeps the tensors alive. Do not resize or
        re-point the bound tensors in place (``set_``, ``resize_``): the bound
        call uses the pointers and strides read here."""
        return BoundRun(self._run.bind(q, k_pool, v_pool, out, lse, scale, k_scale, v_scale),
                        (q, k_pool, v_pool, out, lse), self)

    def run_op(self, q, k_pool, v_pool, out, *, lse=None, scale: Optional[float] = None,
               k_scale: Optional[float] = None, v_scale: Optional[float] = None):
        """run() through the PyTorch custom op ``torch.ops.treeattn.run``
        (treeattn/torch_ops.py): the same launch on the current stream, which
        ``torch.compile`` traces without a graph break (PyTorch >= 2.4).
        PyTorch tensors; ``out`` (and ``lse``) given. Returns ``out``, or
        ``(out, lse)``."""
        from . import torch_ops

        if not torch_ops.available:
            raise RuntimeError("run_op: needs PyTorch >= 2.4 (torch.library.custom_op); use run()")
        if out is None:
            raise ValueError("out: run_op writes into out (an op cannot return a new tensor here): pass one")
        # The op's dispatcher would refuse these without naming the argument, or
        # take a tensor elsewhere than the runtime's device (a meta one) to its
        # fake kernel, which computes nothing; a negated view would reach run()
        # as a temporary copy, out written through it lost. Checked in eager
        # calls: Dynamo traces none of the checks below but the first two (a
        # compiled call's tensors reach run() itself, which checks them).
        eager = not torch_ops.torch.compiler.is_compiling()
        for name, x in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("out", out), ("lse", lse)):
            if x is None and name == "lse":
                continue
            if not isinstance(x, torch_ops.torch.Tensor):
                raise TypeError(f"{name}: run_op takes PyTorch tensors, got {type(x).__name__} (run() takes any DLPack array)")
            _require_dense(name, x)
            if eager and x.device.type != self.device:
                raise ValueError(f"{name}: expected a tensor on {self.device} (the TreeAttention's device), got one on "
                                 f"{x.device}")
            if eager and (x.is_neg() or x.is_conj()):
                raise ValueError(f"{name}: a tensor with its negative or conjugate bit set (a lazy view: its memory "
                                 f"holds other values); pass .resolve_neg() / .resolve_conj()")
        # run()'s number check (a bool, a string, an array, an overflow named); traced: float().
        number = _treeattn._number if eager else (lambda name, x, none: none if x is None else float(x))
        torch_ops.run(self.op_handle, q, k_pool, v_pool, out, lse, number("scale", scale, 0.0),
                      number("k_scale", k_scale, 1.0), number("v_scale", v_scale, 1.0))
        return out if lse is None else (out, lse)

    # -- inspection -------------------------------------------------------------
    @property
    def num_queries(self) -> int:
        """Queries of the last plan."""
        return self._impl.num_queries

    def plan_summary(self) -> dict:
        """The last plan's units, rows, KV bytes loaded vs unique, partial bytes... (as ``treeattn plan`` prints)."""
        return self._impl.plan_summary()

    def plan_stats(self) -> dict:
        """How the steps so far were planned: ``{"planned": fresh plans, "extended": steps that extended the last,
        "pages_rechecked": fresh plans that checked only the pages of nodes changed since the last tree}``."""
        return self._impl.plan_stats()

    def describe(self) -> str:
        """The executor's launches (CUDA) or "cpu executor"."""
        return self._impl.describe()

    # -- CUDA graphs ------------------------------------------------------------
    @property
    def graph_launches(self) -> int:
        """The attention launches a captured ``run()`` records: a mask over ``describe()``'s launches (bit i:
        launch i; default: all but the m128 skip variant's, whose masked units then run on the plain m128 launch).
        A recorded launch also runs the units of the left-out launches after it, and
        launch 0 (the largest tile) is recorded whatever the mask (last, where the mask leaves it out), so a graph
        captured under any mask runs any later plan correctly. A recorded launch the plan leaves empty costs 2-3
        us of a replay (less as the last one), so an engine may keep one graph per ``plan_launches`` value (set
        ``graph_launches = plan_launches`` before capturing it) and replay the one that matches each step's plan.
        Setting it changes no graph already captured. CPU: 0 (no launches; only 0 may be set)."""
        return self._impl.graph_launches

    @graph_launches.setter
    def graph_launches(self, launches: int) -> None:
        if isinstance(launches, bool) or not isinstance(launches, numbers.Integral):  # (NumPy's bool is not Integral)
            raise TypeError(f"graph_launches: expected an int mask, got {type(launches).__name__}")
        launches = int(launches)
        if not 0 <= launches < 1 << 32:
            raise ValueError(f"graph_launches: {launches} is not a mask over describe()'s launches (0 .. 2**32 - 1)")
        self._impl.graph_launches = launches

    @property
    def plan_launches(self) -> int:
        """The launches the plan in force uses, as a ``graph_launches`` mask (0 before any plan, and on the
        CPU): the mask under which a captured run of this plan launches no tile it leaves empty but a last
        launch 0."""
        return self._impl.plan_launches


class BoundRun:
    """TreeAttention.run() with its tensors bound (TreeAttention.bind)."""

    __slots__ = ("_impl", "_tensors", "_attn")

    def __init__(self, impl, tensors, attn: TreeAttention):
        self._impl, self._tensors, self._attn = impl, tensors, attn

    def __call__(self, stream: Optional[int] = None):
        """Launches the attention of the current plan into the bound out (and lse)."""
        self._impl(stream)
        return self._tensors[3]
