"""Factories for the engine's two outside pieces: the attention backend (treeattn's
TreeAttention with a named planner, or the TorchTreeAttention reference) and the radix cache
(treeattn's C++ RadixCache, or the PyRadixCache stand-in). treeattn is imported lazily: the
engine package works before the C++ extension is built."""
import torch

from .errors import InputError
from .py_radix import PyRadixCache
from .torch_attention import TorchTreeAttention

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def make_attention(name, cfg, page_size, num_pages, device, dtype, max_queries, max_nodes,
                   max_page_refs):
    """name: "torch-ref", or a treeattn planner ("auto", "per-query", "fasttree", ...)."""
    caps = dict(max_queries=max_queries, max_nodes=max_nodes, max_page_refs=max_page_refs)
    shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, page_size, num_pages)
    if name == "torch-ref":
        return TorchTreeAttention(*shape, dtype=_DTYPE_NAMES[dtype], device=str(device), **caps)
    try:
        import treeattn
        tree_attention, planners = treeattn.TreeAttention, dict(treeattn.planners())
    except (ImportError, AttributeError) as e:
        raise InputError(f"attention: {name!r} needs the treeattn extension ({e}); "
                         f"use --attention torch-ref") from e
    if name not in planners:   # the name first: a wrong one is wrong at any dtype
        raise InputError(f"attention: unknown {name!r} (known: torch-ref, {', '.join(planners)})")
    if dtype not in (torch.bfloat16, torch.float16):
        raise InputError(f"attention: treeattn runs bf16 or fp16, got dtype {dtype}; "
                         f"use --attention torch-ref for fp32")
    return tree_attention(*shape, dtype=_DTYPE_NAMES[dtype], device=torch.device(device).type,
                          planner=name, **caps)


def make_cache(kind, num_pages, page_size):
    """kind: "cpp" (treeattn.RadixCache), "py" (PyRadixCache), "auto" (cpp if built)."""
    if kind not in ("auto", "cpp", "py"):
        raise InputError(f"cache: expected auto, cpp or py, got {kind!r}")
    if kind in ("auto", "cpp"):
        try:
            from treeattn import RadixCache
            return RadixCache(num_pages, page_size)
        except ImportError:
            if kind == "cpp":
                raise
    return PyRadixCache(num_pages, page_size)
