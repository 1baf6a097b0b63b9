"""Llama-family decoder (Llama 3/3.1, Qwen2/2.5, Mistral) whose attention reads and writes a
paged KV pool through an attention context: the treeattn backend for decode, gathered-prefix
causal attention for prefill. Parameter names match Hugging Face checkpoints one to one."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # statistics in fp32 whatever the weights' dtype, as Hugging Face does
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, with Llama 3's frequency-dependent scaling."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s.get("rope_type", s.get("type")) != "llama3":
        return inv
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def rotate(x, cos, sin):
    """x [T, H, D]; cos/sin [T, D] (the half-split layout of Hugging Face's rotate_half)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.hq, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.hq * self.d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, slots, kv, ctx):
        t = x.shape[0]
        q = rotate(self.q_proj(x).view(t, self.hq, self.d), cos, sin)
        k = rotate(self.k_proj(x).view(t, self.hkv, self.d), cos, sin)
        v = self.v_proj(x).view(t, self.hkv, self.d)
        # the new tokens' KV goes into the pool first: attention then reads every
        # context token, new or cached, from the pool alone
        kv.write(self.layer, slots, k, v)
        out = ctx.attend(self.layer, q.contiguous(), kv.k[self.layer], kv.v[self.layer])
        return self.o_proj(out.reshape(t, self.hq * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, slots, kv, ctx):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, slots, kv, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """forward(ids [T], positions [T], slots [T], kv, ctx) -> logits [T, vocab] (fp32).

    slots[i] = page * page_size + offset is the pool row where token i's K/V is written;
    ctx.attend(layer, q [T, Hq, D], k_pool, v_pool) returns [T, Hq, D] and sees those rows."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # fp32 buffer, not a parameter: checkpoints do not carry it
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def rope(self, positions, dtype):
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, ids, positions, slots, kv, ctx, logit_rows=None):
        x = self.model.embed_tokens(ids)
        cos, sin = self.rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, slots, kv, ctx)
        if logit_rows is not None:   # prefill needs only the last token's logits
            x = x[logit_rows]
        x = self.model.norm(x)
        return F.linear(x, self.head_weight()).float()
