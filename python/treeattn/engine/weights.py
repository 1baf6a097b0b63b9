"""load_model: a CausalLM from a Hugging Face folder (config.json + *.safetensors, sharded or
not) or with random weights of a named shape ("random:tiny", "random:llama3-8b", ...),
allocated directly on the target device in the target dtype."""
import os

import torch

from .config import ModelConfig, named_config, read_config
from .errors import InputError, allocating, read_json
from .model import CausalLM, rope_inv_freq

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def parse_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise InputError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def empty_model(cfg: ModelConfig, device, dtype) -> CausalLM:
    """Parameters allocated on the device, uninitialised: no CPU copy, no fp32 detour."""
    with torch.device("meta"):
        model = CausalLM(cfg).to(dtype)   # meta: no memory until to_empty, then dtype-sized
    gib = sum(p.numel() for p in model.parameters()) * dtype.itemsize / 2 ** 30
    with allocating(f"model: its {gib:.4g} GiB of {dtype} weights", device):   # sized by the config
        model = model.to_empty(device=device)
    model.inv_freq = rope_inv_freq(cfg).to(device)   # meta buffers come back empty
    return model.eval().requires_grad_(False)


def random_model(cfg: ModelConfig, device, dtype, seed: int = 0) -> CausalLM:
    model = empty_model(cfg, device, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:   # std 0.02 keeps activations bounded through many layers; drawn in
            # fp32 so that a model's weights are the same values (up to rounding)
            # in every dtype and on every PyTorch version
            p.copy_(torch.empty(p.shape, dtype=torch.float32, device=p.device).normal_(0.0, 0.02, generator=gen))
    model.fuse_projections()
    return model


def shard_map(folder: str) -> dict:
    """tensor name -> shard file, from model.safetensors.index.json or the lone shard."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        data = read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(f"{index}: malformed index (weight_map must map tensor names to "
                             f"file names, got {weight_map!r:.80})")
        return {name: os.path.join(folder, shard) for name, shard in weight_map.items()}
    shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not shards:
        raise InputError(f"model folder {folder!r}: no *.safetensors file")
    names = {}
    for shard in shards:
        path = os.path.join(folder, shard)
        with _open_shard(path) as f:
            names.update({name: path for name in f.keys()})
    return names


def _open_shard(path):
    """safe_open(path), its errors on a file that is not safetensors (truncated, empty, a
    folder) as InputError naming the file."""
    from safetensors import SafetensorError, safe_open
    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError) as e:
        raise InputError(f"{path}: cannot read as safetensors ({e})") from e


def load_weights(model: CausalLM, folder: str):
    where = shard_map(folder)
    params = dict(model.named_parameters())
    for name in params:
        if name not in where:
            raise InputError(f"model folder {folder!r}: missing tensor {name!r}")
    by_shard = {}
    for name in params:
        by_shard.setdefault(where[name], []).append(name)
    for path, names in by_shard.items():
        if not os.path.isfile(path):
            raise InputError(f"{path}: shard file named in the index is missing")
        with _open_shard(path) as f:
            for name in names:
                t = f.get_tensor(name)
                p = params[name]
                if tuple(t.shape) != tuple(p.shape):
                    raise InputError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, "
                                     f"the config implies {tuple(p.shape)}")
                p.copy_(t)   # converts to the model's dtype and device


def load_model(path_or_name: str, device="cpu", dtype="bf16", seed: int = 0) -> CausalLM:
    dtype = parse_dtype(dtype)
    if path_or_name.startswith("random:"):
        return random_model(named_config(path_or_name[len("random:"):]), device, dtype, seed)
    if not os.path.isdir(path_or_name):
        raise InputError(f"model: {path_or_name!r} is neither a folder nor random:NAME")
    model = empty_model(read_config(path_or_name), device, dtype)
    load_weights(model, path_or_name)
    model.fuse_projections()
    return model
