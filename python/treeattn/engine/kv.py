"""The paged KV pool: one layer-major K tensor and one V tensor
[num_layers, num_pages, page_size, num_kv_heads, head_dim]; k[layer] is the NHD pool that
treeattn reads. A token's row is page * page_size + offset."""
import math

import torch

from .errors import allocating, host_memory


def max_kv_tokens(model):
    """The most tokens whose K and V (every layer) the memory of the model's device holds:
    a program needing more cannot run, and is refused before its token lists are made
    (errors.check_program_size)."""
    w = model.model.embed_tokens.weight
    cfg = model.cfg
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * w.dtype.itemsize
    if w.device.type == "cuda":
        memory = torch.cuda.get_device_properties(w.device).total_memory
    else:
        memory = host_memory()
    return memory // per_token


class KVPool:
    def __init__(self, num_layers, num_pages, page_size, num_kv_heads, head_dim, device, dtype):
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.num_pages, self.page_size = num_pages, page_size
        gib = 2 * math.prod(shape) * dtype.itemsize / 2 ** 30
        with allocating(f"kv pool: {num_pages} pages of {page_size} tokens ({gib:.4g} GiB for K and V)",
                        device):
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)

    def _rows(self, t, layer=None):
        # view of the pool as rows; slicing the first dim keeps k[layer] contiguous
        if layer is None:
            return t.view(t.shape[0], -1, t.shape[3], t.shape[4])
        return t[layer].view(-1, t.shape[3], t.shape[4])

    def write(self, layer, slots, k, v):
        """slots [T] int64 rows; k, v [T, Hkv, D]. index_copy_ is graph-capturable."""
        self._rows(self.k, layer).index_copy_(0, slots, k.to(self.k.dtype))
        self._rows(self.v, layer).index_copy_(0, slots, v.to(self.v.dtype))

    def copy_rows(self, src, dst):
        """Copy rows src -> dst (int64 [N] on the pool's device) in every layer (the leftover
        rows of forked sequences): one gather and one scatter per pool, along dim 0 of its
        [layers * rows, heads * dim] view."""
        layers, rows = self.k.shape[0], self.num_pages * self.page_size
        offsets = torch.arange(layers, device=src.device)[:, None] * rows
        src, dst = (offsets + src).reshape(-1), (offsets + dst).reshape(-1)
        for t in (self.k, self.v):
            flat = t.view(layers * rows, -1)
            flat.index_copy_(0, dst, flat.index_select(0, src))
