"""Bad input: model folders with a missing or malformed config.json, an unknown
architecture, a missing tensor or a shape mismatch; prompts longer than the KV cache; the
cache keeps its invariants (and its free pages) after every failed request."""
import json
import re
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_models import save, tiny_hf_model
from treeattn.engine import build_engine, load_model, make_program, parse_spec
from treeattn.engine.errors import InputError, host_memory


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save(tiny_hf_model("llama3"), tmp_path_factory.mktemp("llama"))


def copy_folder(src, dst, edit_config=None, drop=None, reshape=None):
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    if edit_config:
        edit_config(cfg)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:-1].contiguous()
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return str(dst)


def test_missing_config(tmp_path):
    with pytest.raises(ValueError, match="missing config.json"):
        load_model(str(tmp_path))


def test_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text("{\"model_type\": \"llama\",")
    with pytest.raises(ValueError, match=r"config.json: malformed JSON"):
        load_model(str(tmp_path))


def test_config_missing_field(llama_folder, tmp_path):
    folder = copy_folder(llama_folder, tmp_path, lambda c: c.pop("hidden_size"))
    with pytest.raises(ValueError, match="config.json: missing required field 'hidden_size'"):
        load_model(folder)


def test_unknown_architecture(llama_folder, tmp_path):
    def gpt2(c):
        c["architectures"], c["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    with pytest.raises(ValueError, match="unknown architecture.*GPT2LMHeadModel"):
        load_model(copy_folder(llama_folder, tmp_path, gpt2))


def test_missing_tensor(llama_folder, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(ValueError, match=f"missing tensor '{name}'"):
        load_model(copy_folder(llama_folder, tmp_path, drop=name))


def test_shape_mismatch(llama_folder, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    with pytest.raises(ValueError, match=rf"model.safetensors: tensor '{name}' has shape \(127, 256\), the config implies \(128, 256\)"):
        load_model(copy_folder(llama_folder, tmp_path, reshape=name))


def test_config_shape_mismatch(llama_folder, tmp_path):
    folder = copy_folder(llama_folder, tmp_path, lambda c: c.update(intermediate_size=96))
    with pytest.raises(ValueError, match="gate_proj.weight' has shape"):
        load_model(folder)


def test_unknown_random_shape_and_dtype():
    with pytest.raises(ValueError, match="unknown random shape 'huge'"):
        load_model("random:huge")
    with pytest.raises(ValueError, match="dtype: expected one of"):
        load_model("random:tiny", dtype="int8")


def test_bad_program_specs():
    with pytest.raises(ValueError, match="unknown kind 'tree'"):
        parse_spec("tree:prompt=3")
    with pytest.raises(ValueError, match="bad parameter 'branch=3'"):
        parse_spec("shared:branch=3")
    with pytest.raises(ValueError, match="top_p: expected in"):
        make_program("sample:top_p=0", 100)
    # Lengths >= 0 and counts >= 1, named where they are given (NumPy's "negative
    # dimensions" or a run of no sequences before).
    for spec, text in (("shared:prompt=-1", "prompt=-1 must be >= 0"), ("two-level:docs=-1", "docs=-1 must be >= 0"),
                       ("shared:branches=0", "branches=0 must be >= 1"), ("sample:n=0", "n=0 must be >= 1"),
                       ("independent:seqs=0", "seqs=0 must be >= 1")):
        with pytest.raises(ValueError, match=re.escape(text)):
            make_program(spec, 100)
    with pytest.raises(ValueError, match="vocab_size = 0"):
        make_program("shared:prompt=4", 0)
    assert len(make_program("shared:prompt=5,question=0,branches=2", 100).prompts) == 2   # a length may be 0


def test_program_sizes_are_checked_before_any_token_is_made():
    """Every program constructor checks its sizes first: token id lists past the host's
    memory, and (given the device's bound) KV tokens past it, are an InputError at once; the
    sizes it checks are the programs' own (token ids + one per prompt, distinct prefixes)."""
    from treeattn.engine.programs import KINDS, prompt_sizes
    from treeattn.engine.speculative import parse_spec_program
    from treeattn.engine.tot import make_tot_program
    huge = 10 ** 11
    for make in (lambda: make_program(f"shared:branches={huge},question=0", 100),
                 lambda: make_program(f"fewshot:questions={huge}", 100),
                 lambda: make_tot_program(f"tot-live:prompt=1,tasks={huge}", 100),
                 lambda: parse_spec_program(f"spec:requests={huge},tree=2x2", 100)):
        with pytest.raises(InputError, match="token ids, more than this host's memory"):
            make()
    with pytest.raises(InputError, match="at least 4016 KV tokens, more than the device's memory holds"):
        make_program("shared:prompt=4000,branches=1,question=16", 100, max_kv_tokens=4015)
    make_program("shared:prompt=4000,branches=1,question=16", 100, max_kv_tokens=4016)
    small = dict(prompt=5, branches=3, question=2, system=4, docs=2, doc=3, questions=3, shots=2, shot=3,
                 n=4, seqs=3)
    for kind in KINDS:
        params = {k: v for k, v in small.items() if k in KINDS[kind]}
        program = make_program(f"{kind}:" + ",".join(f"{k}={v}" for k, v in params.items()), 10 ** 9)
        prefixes = {tuple(p[:i + 1]) for p in program.prompts for i in range(len(p))}
        ids, distinct = prompt_sizes(kind, dict(KINDS[kind], **params))
        assert (ids, distinct) == (sum(len(p) + 1 for p in program.prompts), len(prefixes)), kind


def test_prompt_longer_than_cache():
    model = load_model("random:tiny", dtype="fp32")
    engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=9)  # 8 usable
    free = engine.cache.num_free_pages()
    with pytest.raises(ValueError, match=r"prompt: 33 tokens need 9 pages of 4, the KV cache "
                                         r"holds 8 pages"):
        engine.add(list(range(33)))
    seq, _ = engine.add(list(range(20)))          # 5 pages: fits alone
    with pytest.raises(ValueError, match="prompt: KV cache full, 4 more pages"):
        engine.add(list(range(100, 116)))          # 4 more pages, 3 free: fails cleanly
    engine.cache.check()
    engine.release(seq, publish=False)
    engine.cache.check()
    engine.cache.evict(free)        # the first prompt's whole pages stayed cached, unlocked
    assert engine.cache.num_free_pages() == free
    seq, _ = engine.add(list(range(100, 116)))      # and the cache still works
    engine.release(seq)
    engine.cache.check()


def test_decode_runs_out_of_pages():
    model = load_model("random:tiny", dtype="fp32")
    engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=4)   # 3 usable
    seq, logits = engine.add(list(range(8)))       # 2 pages
    for _ in range(4):                             # page 3 holds tokens 8..11
        seq.tokens.append(int(logits.argmax()))
        logits = engine.decode([seq])[0]
    seq.tokens.append(1)
    with pytest.raises(ValueError, match="decode: KV cache full"):
        engine.decode([seq])
    engine.release(seq)
    engine.cache.check()


def test_decode_ids_named_when_wrong():
    """decode(seqs, ids=...) (the sampled ids fed on the device) refuses ids of the wrong
    dtype, length or device by name, before reserving anything; right ids decode as the
    host's would."""
    import torch
    model = load_model("random:tiny", dtype="fp32")
    logits = []
    for feed in (False, True):
        engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=16)
        seq, first = engine.add(list(range(6)))
        token = int(first.argmax())
        assert token != 0   # the staged placeholder: a fed id must differ from it to show
        for bad, what in ((torch.tensor([token], dtype=torch.int32), "int32"),
                          (torch.tensor([token, token]), r"\(2,\)"),
                          (torch.tensor(token), r"\(\)")):
            with pytest.raises(ValueError, match=r"ids: expected an int64 tensor \[1\] on cpu, "
                                                 r"got .*" + what):
                engine.decode([seq], ids=bad)
        assert seq.kv_len == 6
        if feed:   # seq.tokens lacks the pending id: only the device tensor has it
            logits.append(engine.decode([seq], ids=torch.tensor([token]))[0])
        else:
            seq.tokens.append(token)
            logits.append(engine.decode([seq])[0])
        engine.release(seq, publish=False)
        engine.cache.check()
    assert torch.equal(*logits)


def test_failed_runs_release_their_sequences():
    """run_program and run_speculative that stop on an error (here: the pool fills up)
    release every sequence they made: the pool's pages come back and the next run works
    (found by an adversarial probe: the pages stayed locked, every later run failed)."""
    from treeattn.engine import run_program
    from treeattn.engine.speculative import parse_spec_program, run_speculative
    from treeattn.engine.drafting import default_workloads
    model = load_model("random:tiny", dtype="fp32")
    engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=20, max_batch=8)
    free = engine.cache.num_free_pages()
    with pytest.raises(ValueError, match="KV cache full"):
        run_program(engine, make_program("shared:prompt=10,branches=4,question=2,gen=30", 256))
    engine.cache.check()
    engine.cache.evict(free)
    assert engine.cache.num_free_pages() == free
    result = run_program(engine, make_program("shared:prompt=10,branches=2,question=2,gen=20", 256))
    for s in result.seqs:
        engine.release(s)
    engine.cache.check()
    spec = parse_spec_program("spec:prompt=10,requests=4,question=2,repeat=3,gen=60,tree=4x4", 256, 0,
                              default_workloads())
    small = build_engine(model, "torch-ref", "py", page_size=4, num_pages=12, max_batch=4, max_drafts=64)
    free = small.cache.num_free_pages()
    with pytest.raises(ValueError, match="KV cache full"):
        run_speculative(small, spec)
    small.cache.check()
    small.cache.evict(free)
    assert small.cache.num_free_pages() == free


def test_sequences_and_tokens_are_checked_before_anything_changes():
    """A sequence twice in one step, a step without its pending token, token ids outside
    the vocabulary or not ints, fork into no children, sampling parameters that are nan
    or of the wrong type: each a ValueError / TypeError naming it, the engine unchanged."""
    from treeattn.engine import SamplingParams
    from treeattn.engine.drafting import Draft
    from treeattn.engine.speculative import verify
    model = load_model("random:tiny", dtype="fp32")
    vocab = model.cfg.vocab_size
    engine = build_engine(model, "torch-ref", "py", page_size=4, num_pages=32, max_batch=4)
    seq, logits = engine.add([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=r"seqs\[0\]: no pending token \(kv_len 5, 5 tokens\)"):
        engine.decode([seq])
    seq.tokens.append(int(logits.argmax()))
    with pytest.raises(ValueError, match=r"seqs\[1\] is seqs\[0\]: a sequence decodes once a step"):
        engine.decode([seq, seq])
    with pytest.raises(ValueError, match=r"seqs\[1\] is seqs\[0\]: a sequence is verified once a step"):
        verify(engine, [seq, seq], [Draft([], []), Draft([], [])])
    assert seq.kv_len == 5 and len(seq.tokens) == 6
    engine.decode([seq])                   # still decodes
    assert seq.kv_len == 6
    seq.tokens.append(vocab)
    with pytest.raises(ValueError, match=rf"seqs\[0\]: pending token {vocab} is outside the vocabulary"):
        engine.decode([seq])
    seq.tokens[-1] = 7
    with pytest.raises(ValueError, match=rf"tokens\[2\] = {vocab} is outside the vocabulary \[0, {vocab}\)"):
        engine.add([1, 2, vocab])
    with pytest.raises(ValueError, match=r"tokens\[1\] = -1 is outside the vocabulary"):
        engine.add([1, -1])
    with pytest.raises(TypeError, match="tokens: token ids are ints, got 1.7"):
        engine.add([1.7, 2])
    for n in (0, -1, 1.5):
        with pytest.raises(ValueError, match="n: expected a number of children >= 1"):
            engine.fork(seq, n)
    engine.decode([seq])                   # the failed calls left it as it was
    engine.release(seq)
    engine.cache.check()
    for kw, error in ((dict(temperature=float("nan")), ValueError), (dict(temperature=float("inf")), ValueError),
                      (dict(temperature="1"), TypeError), (dict(top_k=1.5), TypeError),
                      (dict(top_p=True), TypeError)):
        with pytest.raises(error, match=next(iter(kw))):
            SamplingParams(**kw)


@pytest.mark.parametrize("cache", ["py", "cpp"])
def test_released_sequences_are_refused(cache):
    """A sequence release() or fork() ended: its pages went back to the pool, where another
    sequence takes them. decode / verify / fork / publish / release of it are a ValueError;
    before, decode wrote into the freed pages (another sequence's KV) once a token was
    appended, and release / fork failed on the cache's internals."""
    from treeattn.engine.drafting import Draft
    from treeattn.engine.speculative import verify
    model = load_model("random:tiny", dtype="fp32")
    engine = build_engine(model, "torch-ref", cache, page_size=4, num_pages=32, max_batch=4)
    seq, logits = engine.add([1, 2, 3, 4, 5, 6])
    seq.tokens.append(int(logits.argmax()))
    parent = seq
    (seq,) = engine.fork(parent, 1)
    engine.release(seq)
    released = "a released sequence"
    other, _ = engine.add([9, 8, 7, 6, 5, 4, 3])    # may take the freed pages
    other.tokens.append(1)
    for s in (seq, parent):
        with pytest.raises(ValueError, match=r"seqs\[1\]: " + released):
            engine.decode([other, s])
        with pytest.raises(ValueError, match=r"seqs\[0\]: " + released):
            verify(engine, [s], [Draft([], [])])
        for call in (lambda: engine.release(s), lambda: engine.fork(s, 2), lambda: engine.publish(s)):
            with pytest.raises(ValueError, match=released):
                call()
    s.tokens = s.tokens[:s.kv_len]                  # no pending token: still named as released
    with pytest.raises(ValueError, match=r"seqs\[0\]: " + released):
        engine.decode([s])
    assert not engine.prepare([other, seq])
    engine.decode([other])                           # the engine is unharmed
    engine.release(other)
    engine.cache.check()


def test_engine_sizes_are_checked_as_given():
    """build_engine's sizes, named with the value the caller gave (the pool's error named
    num_pages - 1, its scratch page left out)."""
    model = load_model("random:tiny", dtype="fp32")
    for kw, error, text in ((dict(num_pages=1), ValueError, "num_pages = 1: expected >= 2"),
                            (dict(max_batch=0), ValueError, "max_batch = 0: expected >= 1"),
                            (dict(max_drafts=-4), ValueError, "max_drafts = -4: expected >= 0"),
                            (dict(page_size=2.5), TypeError, "page_size: expected an int, got 2.5")):
        with pytest.raises(error, match=re.escape(text)):
            build_engine(model, "torch-ref", "py", **{**dict(page_size=4, num_pages=16), **kw})


def test_config_fields_are_checked_by_name():
    """config.json fields the decoder cannot use: a ValueError naming the field (raw
    KeyError / TypeError / torch errors, or a silent default, before)."""
    from treeattn.engine import config_from_dict
    base = dict(architectures=["LlamaForCausalLM"], vocab_size=100, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    assert config_from_dict(base).head_dim == 16
    for edit, text in ((dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}), "needs 'factor'"),
                       (dict(rope_theta=-1.0), "rope_theta = -1.0 must be a positive number"),
                       (dict(rope_theta=0), "rope_theta = 0.0 must be a positive number"),
                       (dict(num_hidden_layers=0), "num_hidden_layers = 0 must be a positive integer"),
                       (dict(num_key_value_heads=0), "num_key_value_heads = 0 must be a positive integer"),
                       (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads = 3"),
                       (dict(head_dim=63), "head_dim = 63 must be even"),
                       (dict(rope_parameters=[1, 2]), "rope_parameters must be an object")):
        with pytest.raises(ValueError, match=re.escape(text)):
            config_from_dict({**base, **edit})
    with pytest.raises(ValueError, match="expected an object"):
        config_from_dict([1, 2])


def test_cli_reports_bad_input_without_a_traceback(capsys):
    """python -m treeattn.engine: a device this PyTorch lacks, an unknown attention (named
    before the dtype), a bad program spec: exit 2 with one line naming the option or field
    (before: torch's AssertionError, the dtype, a traceback)."""
    from treeattn.engine.__main__ import main
    cases = [(["--device", "bogus"], "--device bogus: not a device"),
             (["--attention", "bogus", "--dtype", "fp32"], "attention: unknown 'bogus' (known: torch-ref, auto,"),
             (["--program", "shared:prompt=-3", "--dtype", "fp32", "--attention", "torch-ref"], "prompt")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda: no CUDA device in this PyTorch"))
    for argv, text in cases:
        with pytest.raises(SystemExit) as e:
            main(argv + ["--steps", "1", "--model", "random:tiny"])
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert text in err and "Traceback" not in err, (argv, err)


def test_cli_reports_input_errors_in_one_line_and_library_errors_with_a_traceback(capsys, monkeypatch,
                                                                                  tmp_path):
    """python -m treeattn.engine: what the user gave that is wrong or cannot be served (a
    model path, a recorded or topology file, a pool too small for a prompt or for a decode
    step) exits 2 with one line naming it; a ValueError or TypeError from inside the
    library (a bug, stood in for by a patched function) is not taken for bad input: it
    propagates with its traceback."""
    from treeattn.engine import programs
    from treeattn.engine.__main__ import main
    bad_tree = tmp_path / "tree.json"
    bad_tree.write_text("{\"Tree_Structure\": [[0], [0]]}")
    base = ["--model", "random:tiny", "--device", "cpu", "--dtype", "fp32", "--attention", "torch-ref",
            "--steps", "30"]
    cases = [(["--model", str(tmp_path / "none")], "is neither a folder nor random:NAME"),
             (["--program", f"tot:file={tmp_path / 'none.json'}"], "none.json: cannot read"),
             (["--program", f"spec:prompt=20,requests=2,gen=4,tree={bad_tree}"],
              "Tree_Structure[1]: path [0] appears twice"),
             (["--num-pages", "1"], "--num-pages: expected an integer >= 2, got 1"),
             (["--program", "shared:prompt=40,branches=2,gen=4", "--num-pages", "4", "--page-size", "4"],
              "the KV cache holds 3 pages"),
             (["--program", "shared:prompt=8,question=0,branches=2,gen=16", "--num-pages", "6",
               "--page-size", "4"], "decode: KV cache full")]
    for argv, text in cases:
        with pytest.raises(SystemExit) as e:
            main(base + argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "error:" in line]   # not usage or progress
        assert len(lines) == 1 and text in lines[0] and "Traceback" not in err, (argv, err)

    for error in (ValueError("an internal check failed"), TypeError("f() takes 2 arguments")):
        def run_program(*args, **kwargs):
            raise error
        monkeypatch.setattr(programs, "run_program", run_program)
        with pytest.raises(type(error), match=re.escape(str(error))):
            main(base + ["--program", "shared:prompt=8,branches=2,gen=4"])


def test_cli_reports_outside_input_the_libraries_refuse_in_one_line(capsys, llama_folder, tmp_path):
    """python -m treeattn.engine: input that only a library call below the engine refuses, with
    a ValueError / TypeError / its own error of that library (numpy's and torch's seeds, the
    C++ RadixCache's and TreeAttention's size limits, json's UnicodeDecodeError and
    RecursionError, safetensors' SafetensorError, float() / int() of a config field, an
    allocation the pool or the model cannot get), exits 2 with one line naming it (found by an
    adversarial probe of the CLI: each was a traceback after InputError replaced the catch of
    every ValueError / TypeError, several were one before)."""
    from treeattn.engine.__main__ import main

    def folder(name, edit=None, config=None, weights=None, index=None):
        dst = tmp_path / name
        dst.mkdir()
        with open(os.path.join(llama_folder, "config.json")) as f:
            cfg = json.load(f)
        if edit:
            cfg.update(edit)
        (dst / "config.json").write_bytes(config if config is not None else json.dumps(cfg).encode())
        with open(os.path.join(llama_folder, "model.safetensors"), "rb") as f:
            data = f.read()
        if index is not None:
            (dst / "model.safetensors.index.json").write_bytes(index)
        else:
            (dst / "model.safetensors").write_bytes(data if weights is None else weights(data))
        return str(dst)

    def write(name, data):
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    binary = write("binary.json", b"\xff\xfe{}")
    deep = write("deep.json", b"[" * 100000 + b"]" * 100000)
    node = lambda id, value, start, end, children: dict(id=id, value=value, start=start, end=end, children=children)
    late = write("late.json", json.dumps([{"data": {"0": node(0, 4, -3, 0, [1]),
                                                    "1": node(1, 2, 2 ** 70, 2 ** 70 + 2, [])}}]).encode())
    mistral = dict(architectures=["MistralForCausalLM"], model_type="mistral")
    base = ["--model", "random:tiny", "--device", "cpu", "--dtype", "fp32", "--attention", "torch-ref",
            "--steps", "2", "--program", "shared:prompt=8,branches=2,gen=3"]
    cases = [
        (["--seed", "-1"], "--seed: expected an integer in [0, 18446744073709551615], got -1"),
        (["--seed", str(2 ** 64)], f"--seed: expected an integer in [0, 18446744073709551615], got {2 ** 64}"),
        (["--page-size", str(10 ** 12), "--cache", "cpp"], f"page_size = {10 ** 12}"),
        (["--num-pages", str(10 ** 11), "--cache", "cpp"], f"num_pages = {10 ** 11}"),
        (["--page-size", "65537", "--attention", "per-query", "--dtype", "fp16"], "page_size = 65537"),
        (["--program", "shared:prompt=8,branches=2,gen=1000000000000"], "num_pages = "),
        (["--page-size", str(2 ** 31 - 1), "--num-pages", str(2 ** 16), "--cache", "py"],
         f"kv pool: {2 ** 16} pages of {2 ** 31 - 1} tokens"),
        (["--program", f"tot:file={binary}"], "binary.json: malformed JSON"),
        (["--program", f"tot:file={deep}"], "deep.json: malformed JSON"),
        (["--program", f"tot:file={late}"], f"node '1': field 'start' = {2 ** 70} is out of range"),
        (["--program", f"tot-live:prompt_ids={binary}"], "binary.json': malformed JSON"),
        (["--program", f"spec:prompt=8,requests=2,gen=3,tree={binary}"], "binary.json': malformed JSON"),
        (["--model", folder("cfg_binary", config=b"\xff\xfe{}")], "config.json: malformed JSON"),
        (["--model", folder("cfg_deep", config=b"[" * 100000 + b"]" * 100000)], "config.json: malformed JSON"),
        (["--model", folder("eps_str", dict(rms_norm_eps="abc"))], "rms_norm_eps = 'abc' is not a number"),
        (["--model", folder("eps_null", dict(rms_norm_eps=None))], "rms_norm_eps = None is not a number"),
        (["--model", folder("eps_neg", dict(rms_norm_eps=-1.0))], "rms_norm_eps = -1.0 must be"),
        (["--model", folder("window_str", dict(mistral, sliding_window="abc"))],
         "sliding_window = 'abc' must be a positive integer"),
        (["--model", folder("window_list", dict(mistral, sliding_window=[4]))],
         "sliding_window = [4] must be a positive integer"),
        (["--model", folder("window_neg", dict(mistral, sliding_window=-4))],
         "sliding_window = -4 must be a positive integer"),
        (["--model", folder("bias_str", dict(attention_bias="false"))], "attention_bias = 'false' must be true or false"),
        (["--model", folder("type_list", dict(architectures=None, model_type=["llama"]))],
         "unknown architecture ['llama']"),
        (["--model", folder("arch_lists", dict(architectures=[["LlamaForCausalLM"]]))],
         "unknown architecture [['LlamaForCausalLM']]"),
        (["--model", folder("vocab_huge", dict(vocab_size=10 ** 12))], "cannot be allocated"),
        (["--model", folder("truncated", weights=lambda data: data[:len(data) // 2])],
         "model.safetensors: cannot read"),
        (["--model", folder("empty", weights=lambda data: b"")], "model.safetensors: cannot read"),
        (["--model", folder("index_binary", index=b"\xff\xfe")], "model.safetensors.index.json: malformed JSON"),
        (["--model", folder("index_top_list", index=b"[1]")], "model.safetensors.index.json: malformed index"),
        (["--model", folder("index_int", index=json.dumps({"weight_map": {"lm_head.weight": 3}}).encode())],
         "model.safetensors.index.json: malformed index"),
        (["--model", folder("index_list", index=json.dumps({"weight_map": [1]}).encode())],
         "model.safetensors.index.json: malformed index"),
        # sizes with zeros too many: refused before a token is made (were a traceback or a hang)
        (["--program", "shared:prompt=100000000000"], "its prompts hold 6400000001088 token ids"),
        (["--program", "tot-live:prompt=10,tasks=100000000000"], "its prompts hold 1100000000000 token ids"),
        (["--program", "spec:prompt=10,requests=100000000000"], "its prompts hold 2700000000000 token ids"),
        (["--program", f"independent:seqs=1,prompt={host_memory() // 64}"], "KV tokens, more than the device's memory"),
    ]
    failed = []
    for argv, text in cases:
        try:
            with pytest.raises(SystemExit) as e:
                main(base + argv)
        except BaseException as error:   # noqa: BLE001 -- collect every case's outcome
            failed.append((argv, f"raised {type(error).__name__}: {str(error)[:200]}"))
            capsys.readouterr()
            continue
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "error:" in line]   # not usage or progress
        if not (e.value.code == 2 and len(lines) == 1 and text in lines[0] and "Traceback" not in err):
            failed.append((argv, e.value.code, err[-300:]))
    assert not failed, "\n".join(map(str, failed))


def test_cli_program_kind_alone_takes_its_defaults_and_an_unknown_kind_lists_every_kind(capsys, monkeypatch):
    """--program spec (no colon) is speculative decoding with its defaults, as --program
    shared is the shared program's; an unknown kind names every kind the CLI runs."""
    from treeattn.engine import speculative
    from treeattn.engine.__main__ import main
    base = ["--model", "random:tiny", "--device", "cpu", "--dtype", "fp32", "--attention", "torch-ref"]
    seen = []
    monkeypatch.setattr(speculative, "run_cli", lambda args, model: seen.append(args.program) or {})
    main(base + ["--program", "spec"])
    assert seen == ["spec"]
    with pytest.raises(SystemExit) as e:
        main(base + ["--program", "bogus:gen=2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unknown kind 'bogus'" in err, err
    assert all(f"'{kind}'" in err for kind in ("shared", "spec", "tot", "tot-live")), err


def test_hostile_arguments_are_named_before_anything_changes():
    """Found by a bad-input sweep: fork(seq, 10**9) looped without end (a page-aligned sequence
    copies nothing), add(range(10**11)) built the whole list first, float and bool tokens were
    staged as ints, non-sequences, a list of ids and bad seeds escaped as AttributeError,
    IndexError or RuntimeError, a one-shot iterator with a bad id as StopIteration."""
    import numpy as np
    from treeattn.engine import SamplingParams, run_program, sample

    engine = build_engine(load_model("random:tiny", dtype="fp32"), "torch-ref", "cpp", page_size=4, num_pages=32,
                          max_batch=8)
    free = engine.cache.num_free_pages()
    aligned, _ = engine.add([1, 2, 3, 4])
    with pytest.raises(InputError, match=re.escape("n = 1000000000: more children than the KV cache's 31 pages")):
        engine.fork(aligned, 10 ** 9)
    with pytest.raises(InputError, match=re.escape("prompt: 100000000000 tokens need 25000000000 pages of 4")):
        engine.add(range(10 ** 11))
    with pytest.raises(InputError, match=re.escape("prompt: more than 124 tokens need more than 31 pages of 4")):
        engine.add(iter(range(10 ** 11)))
    for tokens, text in (([True, 2, 3], "tokens: token ids are ints, got True"),
                         (iter([1, "x"]), "tokens: token ids are ints, got 'x'"),
                         ({1: 2}, "tokens: expected a sequence of token ids (ints), got dict"),
                         (torch.ones(3, dtype=torch.bool), "tokens: expected a sequence of token ids (ints), got Tensor")):
        with pytest.raises(TypeError, match=re.escape(text)):
            engine.add(tokens)
    seq, logits = engine.add([5, 6, 7])
    for pending in (7.9, True, np.float64(7.9)):
        seq.tokens.append(pending)
        with pytest.raises(TypeError, match=re.escape(f"seqs[0]: pending token {pending!r} is not a token id")):
            engine.decode([seq])
        seq.tokens.pop()
    for call, err, text in ((lambda: engine.decode([1]), TypeError, "seqs[0]: expected a Sequence"),
                            (lambda: engine.forest([1]), TypeError, "seqs[0]: expected a Sequence"),
                            (lambda: engine.release(None), TypeError, "seq: expected a Sequence"),
                            (lambda: engine.decode([seq], ids=[7]), TypeError, "ids: expected an int64 tensor [1]"),
                            (lambda: sample(torch.zeros(5), SamplingParams(0.0, 1.0, 0)), ValueError,
                             "logits: expected a tensor [batch, vocab] with vocab >= 1, got (5,)"),
                            (lambda: make_program(None, 100), TypeError, "spec: expected a program spec (str)"),
                            (lambda: make_program("sample:n=99999999999", 100), InputError,
                             "token ids, more than this host's memory"),
                            (lambda: make_program("independent:seqs=1,prompt=4", 2 ** 80), ValueError,
                             "vocab_size = 1208925819614629174706176: expected an int in [1, 2**31)"),
                            (lambda: run_program(engine, None), TypeError, "program: expected a Program"),
                            (lambda: run_program(engine, make_program("independent:seqs=1,prompt=4,gen=2", 100),
                                                 seed="x"), TypeError, "seed: expected an int, got 'x'"),
                            (lambda: build_engine(None), TypeError, "model: expected a CausalLM")):
        with pytest.raises(err, match=re.escape(text)):
            call()
    assert engine.prepare([1]) is False
    seq.tokens.append(np.int64(9))     # NumPy ints are ids
    engine.decode([seq])
    assert len(engine.fork(aligned, np.int64(2))) == 2
    assert make_program("independent:seqs=1,prompt=4", np.int64(512)).kind == "independent"
    engine.cache.check()
    assert engine.cache.num_free_pages() < free    # the sequences above still hold theirs
