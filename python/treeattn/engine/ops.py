"""The decoder's elementwise steps between its matrix products, one function each: RMSNorm
(with the residual add before it), RoPE on the fused QKV output, SwiGLU's activation; and
the sampler's pass over the logits (sampling.exponential_race).

Eager, each is a handful of PyTorch kernels with Hugging Face's rounding. On a GPU,
compiled_ops() hands them to torch.compile (Triton), which makes each a single kernel: a
decode step of a small batch is a few thousand launches otherwise, and they cost as much
as reading the weights of the layers' smaller matrices. The compiled versions compute in
fp32 between the casts and may round intermediate bf16/fp16 values differently; in fp32
they match the eager ones up to reduction order."""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .errors import InputError
from .sampling import exponential_race


def rms_norm(x, weight, eps: float):
    # statistics in fp32 whatever the weights' dtype, as Hugging Face does
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(x, residual, weight, eps: float):
    """(x + residual, rms_norm(x + residual)): a layer's residual stream and its normed input."""
    s = x + residual
    return s, rms_norm(s, weight, eps)


def _rotate(x, cos, sin):
    """x [T, H, D]; cos/sin [T, D] (the half-split layout of Hugging Face's rotate_half)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def rope_qkv(qkv, cos, sin, hq: int, hkv: int, d: int):
    """qkv [T, (hq + 2 hkv) d] (the fused projection's output) -> q [T, hq, d] and
    k [T, hkv, d] rotated and contiguous, v [T, hkv, d] (a view)."""
    t = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q = _rotate(q.view(t, hq, d), cos, sin).contiguous()
    k = _rotate(k.view(t, hkv, d), cos, sin).contiguous()
    return q, k, v.view(t, hkv, d)


def silu_mul(gate_up):
    """gate_up [T, 2 I] (the fused gate and up projections) -> silu(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class Ops:
    rms_norm: Callable
    add_rms_norm: Callable
    rope_qkv: Callable
    silu_mul: Callable
    race: Callable = exponential_race
    compiled: bool = False


EAGER = Ops(rms_norm, add_rms_norm, rope_qkv, silu_mul)
_COMPILED = None


def compile_available() -> tuple:
    """(ok, why not): torch.compile's GPU backend needs CUDA and Triton."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return False, f"Triton is not installed ({e})"
    return True, ""


RACE_MIN_ROWS = 64   # smaller batches sample eagerly: cheap, and no compile per small size


def _large_batches(compiled_race):
    """compiled_race for batches of RACE_MIN_ROWS rows or more, exponential_race below: the
    compiled one has symbolic shapes from its first call (one compile for every batch and
    vocabulary size, made by a program's first large step: its warm-up), while sizes 0 and 1
    would each compile a specialised version, possibly inside a timed step."""
    def race(scores, inv_temperature: float, noise):
        if scores.shape[0] < RACE_MIN_ROWS:
            return exponential_race(scores, inv_temperature, noise)
        return compiled_race(scores, inv_temperature, noise)
    return race


def compiled_ops() -> Ops:
    """The ops compiled once per process (each function recompiles per input shape class:
    shapes become dynamic after the second distinct one, so batch buckets and prefill
    chunks share kernels)."""
    global _COMPILED
    ok, why = compile_available()
    if not ok:
        raise InputError(f"compile: torch.compile of the engine's ops needs a GPU backend: {why}")
    if _COMPILED is None:
        fn = lambda f: torch.compile(f, fullgraph=True)
        _COMPILED = Ops(fn(rms_norm), fn(add_rms_norm), fn(rope_qkv), fn(silu_mul),
                        _large_batches(torch.compile(exponential_race, fullgraph=True, dynamic=True)),
                        compiled=True)
    return _COMPILED


def choose_ops(mode: str, device) -> Ops:
    """mode "on": compiled (an error where it cannot be); "off": eager; "auto": compiled
    on a CUDA device where Triton is installed, else eager."""
    if mode not in ("auto", "on", "off"):
        raise InputError(f"compile: expected auto, on or off, got {mode!r}")
    if mode == "off" or (mode == "auto" and (torch.device(device).type != "cuda"
                                             or not compile_available()[0])):
        return EAGER
    if torch.device(device).type != "cuda":
        raise InputError(f"compile: on needs a cuda device, got {device}")
    return compiled_ops()
