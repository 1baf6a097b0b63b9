"""Token sampling on the logits' device: temperature, top-k, top-p, seeded by a
torch.Generator; temperature 0 is greedy (argmax).

A draw from softmax(logits / temperature) is made by the exponential race: with noise
E ~ Exp(1) i.i.d. per entry, argmax(logits / temperature - log E) is token i with probability
softmax(logits / temperature)[i] (torch.multinomial draws one sample the same way, after a
softmax and a division that each take a pass over [batch, vocab] in fp32). Here the noise is
one fp32 pass and the race one more, which ops.compiled_ops() fuses into a single kernel
reading the logits in their own dtype."""
import math
import numbers
from dataclasses import dataclass

import torch

from .errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0: greedy
    top_p: float = 1.0
    top_k: int = 0             # 0: no limit

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name}: expected a number, got {value!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise TypeError(f"top_k: expected an int, got {self.top_k!r}")
        if not 0 <= self.temperature < math.inf:   # also refuses nan
            raise InputError(f"temperature: expected a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p: expected in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"top_k: expected >= 0, got {self.top_k}")


def exponential_race(scores, inv_temperature: float, noise):
    """Row-wise argmax(scores * inv_temperature - log(noise)) (int64): with noise ~ Exp(1),
    a draw from softmax(scores * inv_temperature); -inf scores are never drawn."""
    return (scores.float() * inv_temperature - noise.log()).argmax(dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator=None,
           race=exponential_race) -> torch.Tensor:
    """logits [B, V] -> token ids [B] (int64, same device). race: exponential_race or its
    compiled version (ops.Ops.race)."""
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[-1] == 0:
        raise ValueError(f"logits: expected a tensor [batch, vocab] with vocab >= 1, got "
                         f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    inv_temperature = 1.0 / params.temperature
    if params.top_k or params.top_p < 1:
        logits, inv_temperature = logits.float() * inv_temperature, 1.0
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens before it already reach top_p; the first always stays
        drop = probs.cumsum(dim=-1) - probs >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    return race(logits, inv_temperature, noise.exponential_(generator=generator))
