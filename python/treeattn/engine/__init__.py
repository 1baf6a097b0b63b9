"""treeattn.engine: a small Llama-family decode engine over treeattn's tree attention and a
radix KV cache (python -m treeattn.engine --help)."""
from .backends import make_attention, make_cache
from .config import ModelConfig, config_from_dict, named_config, read_config
from .engine import Engine, Sequence, check_sizes
from .errors import InputError, refused
from .model import CausalLM
from .programs import Program, RunResult, make_program, parse_spec, run_program
from .py_radix import PyRadixCache
from .sampling import SamplingParams, sample
from .torch_attention import TorchTreeAttention
from .tot import ToTProgram, ToTResult, make_tot_program, run_tot
from .weights import load_model, parse_dtype


def build_engine(model, attention="torch-ref", cache="auto", page_size=16, num_pages=1024,
                 max_batch=64, graphs=False, max_drafts=0):
    """An Engine with a pool of num_pages pages (the last one is scratch), its cache and its
    attention backend sized for max_batch queries plus max_drafts speculative draft tokens
    per step (each one more query, node and page reference)."""
    if not isinstance(model, CausalLM):
        raise TypeError(f"model: expected a CausalLM (load_model()), got {type(model).__name__}")
    check_sizes(page_size=(page_size, 1), num_pages=(num_pages, 2), max_batch=(max_batch, 1),
                 max_drafts=(max_drafts, 0))
    w = model.model.embed_tokens.weight
    sizes = f"page_size = {page_size}, num_pages = {num_pages}"
    # the C++ TreeAttention's and RadixCache's own limits (int32 fields, node counts)
    with refused(f"attention {attention!r} refuses {sizes}, max_batch = {max_batch}, max_drafts = {max_drafts}"):
        attn = make_attention(attention, model.cfg, page_size, num_pages, w.device, w.dtype,
                              max_queries=max_batch + max_drafts,
                              max_nodes=num_pages + max_batch + 1 + max_drafts,
                              max_page_refs=num_pages + max_drafts)
    with refused(f"cache {cache!r} refuses {sizes} (the last page is scratch)"):
        kv_cache = make_cache(cache, num_pages - 1, page_size)
    return Engine(model, attn, kv_cache, num_pages, page_size, max_batch=max_batch,
                  graphs=graphs, max_drafts=max_drafts)


__all__ = ["CausalLM", "Engine", "InputError", "ModelConfig", "Program", "PyRadixCache", "RunResult",
           "SamplingParams", "Sequence", "ToTProgram", "ToTResult", "TorchTreeAttention",
           "build_engine", "config_from_dict", "load_model", "make_attention", "make_cache",
           "make_program", "make_tot_program", "named_config", "parse_dtype", "parse_spec",
           "read_config", "run_program", "run_tot", "sample"]
