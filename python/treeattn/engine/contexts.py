"""Attention contexts the model's layers call: DecodeContext runs the step's planned
treeattn backend (one plan per step, one run() per layer); PrefillContext attends new tokens
to their gathered context rows (cached prefix + themselves, causal) with PyTorch SDPA."""
import math
import time

import torch
import torch.nn.functional as F


class AttentionTimer:
    """Time spent in attention calls: CUDA events on the GPU (read after the step's
    synchronize), perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.reset()

    def reset(self):
        self.events, self.seconds = [], 0.0

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def stop(self, started):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events.append((started, e))
        else:
            self.seconds += time.perf_counter() - started

    def total(self):
        """Seconds since reset; on the GPU call after the stream is synchronized."""
        return self.seconds + sum(a.elapsed_time(b) for a, b in self.events) / 1e3


class DecodeContext:
    def __init__(self, attention, timer=None):
        self.attention, self.timer = attention, timer

    def attend(self, layer, q, k_pool, v_pool):
        # the output comes from torch's allocator: inside a graph capture it lands in the
        # graph's memory pool, so the backend never allocates while being captured
        out = torch.empty_like(q)
        if self.timer is None:
            return self.attention.run(q, k_pool, v_pool, out=out)
        started = self.timer.start()
        self.attention.run(q, k_pool, v_pool, out=out)
        self.timer.stop(started)
        return out


class PrefillContext:
    """One sequence's chunk: rows [start + T] are the pool rows of its tokens 0..start+T-1
    (the chunk's own K/V already written there); query i sits at position start + i.

    Inputs go to scaled_dot_product_attention as [1, H, len, D] with the GQA heads repeated
    and, for a chunk with no prefix, is_causal instead of a mask: the shapes its fused
    (flash / memory-efficient) kernels take; 3-D inputs with a mask fall back to its
    unfused math path (a dozen kernels per layer, fp32 intermediates)."""

    def __init__(self, rows, start):
        self.rows, self.start = rows, start

    def attend(self, layer, q, k_pool, v_pool):
        t, hq, d = q.shape
        hkv = k_pool.shape[2]
        k = k_pool.reshape(-1, hkv, d)[self.rows].repeat_interleave(hq // hkv, dim=1)
        v = v_pool.reshape(-1, hkv, d)[self.rows].repeat_interleave(hq // hkv, dim=1)
        heads_first = lambda x: x.transpose(0, 1)[None]          # [1, H, len, D]
        if self.start == 0:
            mask, causal = None, True
        else:   # query i (position start + i) sees keys 0..start + i: causal, bottom-aligned
            key_pos = torch.arange(len(self.rows), device=q.device)
            query_pos = torch.arange(t, device=q.device) + self.start
            mask, causal = (key_pos[None, :] <= query_pos[:, None])[None, None], False
        out = F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v),
                                             attn_mask=mask, is_causal=causal,
                                             scale=1.0 / math.sqrt(d))
        return out[0].transpose(0, 1)
