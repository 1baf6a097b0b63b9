"""Llama-family decoder (Llama 3/3.1, Qwen2/2.5, Mistral) whose attention reads and writes a
paged KV pool through an attention context: the treeattn backend for decode, gathered-prefix
causal attention for prefill. Parameter names match Hugging Face checkpoints one to one."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .ops import EAGER, Ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, ops=EAGER):
        return ops.rms_norm(x, self.weight, self.eps)


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


def fuse_linears(linears):
    """One weight (and bias) holding the given Linear layers' rows one after another; each
    layer's parameters become views of it, so state_dict(), loading and the Hugging Face
    names stay as they were and one matrix product computes all of them."""
    weight = torch.cat([l.weight.detach() for l in linears])
    bias = None
    if linears[0].bias is not None:
        bias = torch.cat([l.bias.detach() for l in linears])
    row = 0
    for l in linears:
        n = l.weight.shape[0]
        l.weight.data = weight[row:row + n]
        if bias is not None:
            l.bias.data = bias[row:row + n]
        row += n
    return weight, bias


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
        self.qkv = None   # (weight, bias) once fused

    def fuse(self):
        self.qkv = fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def _apply(self, *args, **kwargs):   # .to() and the like replace the parameters
        self.qkv = None
        return super()._apply(*args, **kwargs)

    def forward(self, x, cos, sin, slots, kv, ctx, ops=EAGER):
        t = x.shape[0]
        if self.qkv is None:
            self.fuse()
        q, k, v = ops.rope_qkv(F.linear(x, *self.qkv), cos, sin, self.hq, self.hkv, self.d)
        # the new tokens' KV goes into the pool first: attention then reads every
        # context token, new or cached, from the pool alone
        kv.write(self.layer, slots, k, v)
        out = ctx.attend(self.layer, q, kv.k[self.layer], kv.v[self.layer])
        return self.o_proj(out.reshape(t, self.hq * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = None   # weight once fused

    def fuse(self):
        self.gate_up, _ = fuse_linears([self.gate_proj, self.up_proj])

    def _apply(self, *args, **kwargs):
        self.gate_up = None
        return super()._apply(*args, **kwargs)

    def forward(self, x, ops=EAGER):
        if self.gate_up is None:
            self.fuse()
        return self.down_proj(ops.silu_mul(F.linear(x, self.gate_up)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, residual, cos, sin, slots, kv, ctx, ops=EAGER):
        """h: the previous layer's output (the embeddings for the first layer, residual
        None), residual: the stream before it. Returns this layer's (output, residual);
        the residual adds are deferred into the next norm so each is one fused op."""
        if residual is None:
            residual, x = h, self.input_layernorm(h, ops)
        else:
            residual, x = ops.add_rms_norm(h, residual, self.input_layernorm.weight,
                                           self.input_layernorm.eps)
        h = self.self_attn(x, cos, sin, slots, kv, ctx, ops)
        norm = self.post_attention_layernorm
        residual, x = ops.add_rms_norm(h, residual, norm.weight, norm.eps)
        return self.mlp(x, ops), residual


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """forward(ids [T], positions [T], slots [T], kv, ctx) -> logits [T, vocab] (fp32).

    slots[i] = page * page_size + offset is the pool row where token i's K/V is written;
    ctx.attend(layer, q [T, Hq, D], k_pool, v_pool) returns [T, Hq, D] and sees those rows.
    The q/k/v and gate/up projections run as one matrix product each: their weights are
    fused on first use (fuse_projections() does it at once) and again after .to()."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # fp32 buffer, not a parameter: checkpoints do not carry it
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.ops = EAGER

    def fuse_projections(self):
        """Fuse each layer's q/k/v and gate/up weights now (their parameters become views
        of the fused ones; the separate copies are freed)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def use_ops(self, ops: Ops):
        """The elementwise ops' implementation: ops.EAGER or ops.compiled_ops()."""
        self.ops = ops

    def head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def rope(self, positions, dtype):
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, ids, positions, slots, kv, ctx, logit_rows=None):
        ops = self.ops
        h, residual = self.model.embed_tokens(ids), None
        cos, sin = self.rope(positions, h.dtype)
        for layer in self.model.layers:
            h, residual = layer(h, residual, cos, sin, slots, kv, ctx, ops)
        if logit_rows is not None:   # prefill needs only the last token's logits
            h, residual = h[logit_rows], residual[logit_rows]
        norm = self.model.norm
        _, x = ops.add_rms_norm(h, residual, norm.weight, norm.eps)
        return F.linear(x, self.head_weight()).float()
