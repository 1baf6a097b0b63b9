"""Model configuration for the engine's Llama-family decoder: read from a Hugging Face
config.json (transformers 4 and 5 layouts) or built from a named shape for random weights."""
import json
import os
from dataclasses import dataclass, field, replace

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
        raise ValueError(f"{path}: missing required field {key!r}")
    return cfg[key]


def _rope(cfg: dict, path: str):
    """(theta, scaling) from transformers 5's rope_parameters or 4's rope_theta + rope_scaling."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0
    scaling = params or dict(cfg.get("rope_scaling") or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise ValueError(f"{path}: rope type {kind!r} is not supported (default, llama3)")
    if kind == "default":
        scaling = {}
    return float(theta), scaling


def config_from_dict(cfg: dict, path: str = "config.json") -> ModelConfig:
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if known:
        model_type = known[0]
    elif archs or model_type not in MODEL_TYPES:
        raise ValueError(f"{path}: unknown architecture {archs or model_type!r}; "
                         f"supported: {sorted(ARCHITECTURES)}")
    heads = int(_require(cfg, "num_attention_heads", path))
    hidden = int(_require(cfg, "hidden_size", path))
    theta, scaling = _rope(cfg, path)
    use_window = cfg.get("use_sliding_window", model_type == "mistral")
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(_require(cfg, "vocab_size", path)),
        hidden_size=hidden,
        intermediate_size=int(_require(cfg, "intermediate_size", path)),
        num_layers=int(_require(cfg, "num_hidden_layers", path)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=int(cfg.get("sliding_window") or 0) if use_window else 0,
    )


def read_config(folder: str) -> ModelConfig:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"model folder {folder!r}: missing config.json ({path})")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
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
        raise ValueError(f"model: unknown random shape {name!r}; known: {sorted(NAMED_SHAPES)}")
    return replace(NAMED_SHAPES[name])
