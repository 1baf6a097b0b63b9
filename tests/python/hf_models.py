"""Tiny random Hugging Face models for the engine tests, saved with save_pretrained: Llama 3
(rope_scaling llama3 with a short original context, so scaling matters) and Qwen2 (QKV bias,
tied embeddings), Mistral; optionally in several safetensors shards."""
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

# head_dim 64 (hidden 256 / 4 heads): the smallest head size treeattn's kernels take
TINY = dict(vocab_size=256, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
            attn_implementation="eager")


def tiny_hf_model(kind: str):
    torch.manual_seed({"llama3": 1, "qwen2": 2, "mistral": 3}[kind])
    if kind == "llama3":
        cfg = LlamaConfig(**TINY, rms_norm_eps=1e-5, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            rope_theta=500000.0, max_position_embeddings=1024)
        model = LlamaForCausalLM(cfg)
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**TINY, sliding_window=4096))
    else:
        cfg = Qwen2Config(**TINY, tie_word_embeddings=True, rope_theta=10000.0)
        model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():   # Hugging Face zeroes biases and sets norms to 1: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    # the engine has no stop token: generate must not stop at (or suppress) EOS either
    model.generation_config.eos_token_id = None
    return model.float().eval()


def save(model, folder, shards=False):
    # ~40 KB shards: the tiny models split into several files plus an index
    model.save_pretrained(folder, max_shard_size="300KB" if shards else "10GB")
    return str(folder)


def hf_logits(hf, tokens):
    """transformers' logits at every position of one sequence, [len(tokens), vocab] fp32."""
    device = next(hf.parameters()).device
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens], device=device)).logits[0].float().cpu()
