"""Model configuration for the engine's Llama-family decoder: read from a Hugging Face
config.json (transformers 4 and 5 layouts) or built from a named shape for random weights."""
import math
import os
from dataclasses import dataclass, field, replace

from .errors import InputError, read_json

# architectures / model types the decoder implements (same math: RMSNorm, RoPE, GQA, SwiGLU)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}
MODEL_TYPES = set(ARCHITECTURES.values())


@dataclass(frozen=True)
class ModelConfig:
    model_type: str            # "llama" | "qwen2" | "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)   # {} or HF rope params ("rope_type": "llama3", ...)
    attention_bias: bool = False    # Qwen2: q/k/v projections carry a bias
    tie_word_embeddings: bool = False
    sliding_window: int = 0         # 0: none; the engine refuses sequences longer than a window


def _require(cfg: dict, key: str, path: str):
    if key not in cfg or cfg[key] is None:
        raise InputError(f"{path}: missing required field {key!r}")
    return cfg[key]


def _rope(cfg: dict, path: str):
    """(theta, scaling) from transformers 5's rope_parameters or 4's rope_theta + rope_scaling."""
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise InputError(f"{path}: {key} must be an object, got {cfg[key]!r}")
    params = dict(cfg.get("rope_parameters") or {})
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = cfg.get("rope_theta")
    theta = 10000.0 if theta is None else _number(theta, "rope_theta", path)
    if not 0 < theta < math.inf:
        raise InputError(f"{path}: rope_theta = {theta} must be a positive number")
    scaling = params or dict(cfg.get("rope_scaling") or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise InputError(f"{path}: rope type {kind!r} is not supported (default, llama3)")
    if kind == "default":
        scaling = {}
    else:
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in scaling:
                raise InputError(f"{path}: llama3 rope scaling needs {key!r}")
            if not _number(scaling[key], key, path) > 0:
                raise InputError(f"{path}: llama3 rope scaling {key} = {scaling[key]} must be positive")
    return theta, scaling


def _number(value, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{path}: {key} = {value!r} is not a number")
    return float(value)


def _size(value, key: str, path: str) -> int:
    """A positive int field (a JSON integer, or a float holding one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise InputError(f"{path}: {key} = {value!r} must be a positive integer")
    return int(value)


def _flag(cfg: dict, key: str, default: bool, path: str) -> bool:
    """A true/false field (null: false); a string such as "false" is refused, not truthy."""
    if key not in cfg:
        return default
    if cfg[key] not in (True, False, None):
        raise InputError(f"{path}: {key} = {cfg[key]!r} must be true or false")
    return bool(cfg[key])


def config_from_dict(cfg: dict, path: str = "config.json") -> ModelConfig:
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: expected an object (a dict), got {type(cfg).__name__}")
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise InputError(f"{path}: architectures = {archs!r} must be a list of names")
    model_type = cfg.get("model_type")
    known = [ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES]
    if known:
        model_type = known[0]
    elif archs or not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise InputError(f"{path}: unknown architecture {archs or model_type!r}; "
                         f"supported: {sorted(ARCHITECTURES)}")
    size = lambda key: _size(_require(cfg, key, path), key, path)
    heads, hidden = size("num_attention_heads"), size("hidden_size")
    kv_heads = heads if cfg.get("num_key_value_heads") is None else size("num_key_value_heads")
    head_dim = hidden // heads if cfg.get("head_dim") is None else size("head_dim")
    if heads % kv_heads:
        raise InputError(f"{path}: num_attention_heads = {heads} is not a multiple of "
                         f"num_key_value_heads = {kv_heads}")
    if head_dim % 2:
        raise InputError(f"{path}: head_dim = {head_dim} must be even (RoPE rotates pairs)")
    theta, scaling = _rope(cfg, path)
    use_window = _flag(cfg, "use_sliding_window", model_type == "mistral", path)
    eps = _number(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", path)
    if not 0 <= eps < math.inf:
        raise InputError(f"{path}: rms_norm_eps = {eps} must be a finite number >= 0")
    window = cfg.get("sliding_window") if use_window else None   # 0 or null: no window
    window = 0 if window is None or window == 0 else _size(window, "sliding_window", path)
    return ModelConfig(
        model_type=model_type,
        vocab_size=size("vocab_size"),
        hidden_size=hidden,
        intermediate_size=size("intermediate_size"),
        num_layers=size("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope_theta=theta,
        rope_scaling=scaling,
        attention_bias=_flag(cfg, "attention_bias", model_type == "qwen2", path),
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings", False, path),
        sliding_window=window,
    )


def read_config(folder: str) -> ModelConfig:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise InputError(f"model folder {folder!r}: missing config.json ({path})")
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return config_from_dict(cfg, path)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# real shapes for timing with random weights (no download)
NAMED_SHAPES = {
    # head_dim 64: the smallest head size treeattn's kernels take
    "tiny": ModelConfig("llama", vocab_size=512, hidden_size=256, intermediate_size=256,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=dict(_LLAMA3_ROPE)),
    "llama3-8b": ModelConfig("llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                             rms_norm_eps=1e-5, rope_theta=500000.0,
                             rope_scaling=dict(_LLAMA3_ROPE)),
    "qwen2.5-7b": ModelConfig("qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                              num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                              rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=True),
}


def named_config(name: str) -> ModelConfig:
    if name not in NAMED_SHAPES:
        raise InputError(f"model: unknown random shape {name!r}; known: {sorted(NAMED_SHAPES)}")
    return replace(NAMED_SHAPES[name])
