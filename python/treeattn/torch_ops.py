"""``TreeAttention.run`` as a PyTorch custom op, for ``torch.compile``d models.

``torch.ops.treeattn.run(handle, q, k_pool, v_pool, out, lse, scale, k_scale, v_scale)`` writes
the attention of the current plan into ``out`` (and ``lse`` when given) and
returns nothing; ``handle`` names the TreeAttention (``TreeAttention.op_handle``;
an op takes ints and tensors, not objects).
Registered with ``torch.library.custom_op`` (PyTorch >= 2.4), with a fake
(meta) implementation, so Dynamo traces through it without a graph break and
Inductor keeps it as one opaque call that mutates ``out`` / ``lse``. Plan
outside the compiled region, as with eager ``run``: the op only launches.

    attn = treeattn.TreeAttention(...)
    @torch.compile(fullgraph=True)
    def layer(q, k_pool, v_pool, out):
        attn.run_op(q, k_pool, v_pool, out)
        return out @ w_o

``available`` is False (and ``run_op`` raises) where PyTorch is missing or older.
(No ``from __future__ import annotations`` here: custom_op reads the schema
from the annotations.)
"""

from typing import Optional

from . import _BY_HANDLE

try:
    import torch

    available = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # no PyTorch: nothing to register
    torch = None
    available = False


def _lookup(handle: int):
    attn = _BY_HANDLE.get(handle)
    if attn is None:
        raise ValueError(f"handle: no live TreeAttention has handle {handle}")
    return attn


if available:

    @torch.library.custom_op("treeattn::run", mutates_args=("out", "lse"))
    def run(handle: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, out: torch.Tensor,
            lse: Optional[torch.Tensor], scale: float, k_scale: float, v_scale: float) -> None:
        """Attention of the current plan of TreeAttention ``handle`` into out (and lse); scale 0: 1/sqrt(d);
        k_scale, v_scale: the K/V pools' dequantisation scales (1 for 16-bit pools)."""
        _lookup(handle).run(q, k_pool, v_pool, out, lse=lse, scale=scale if scale != 0.0 else None, k_scale=k_scale,
                            v_scale=v_scale)

    @run.register_fake
    def _run_fake(handle, q, k_pool, v_pool, out, lse, scale, k_scale, v_scale) -> None:
        return None
