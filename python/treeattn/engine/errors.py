"""The engine's one exception type of its own: InputError, for input from outside the
program that is wrong or cannot be served, and the helpers that raise it where such
input enters a file read, an allocation or a library call."""
import contextlib
import json
import os

import torch


class InputError(ValueError):
    """What the user gave is wrong or cannot be served: a model folder or name, a config,
    weights, recorded ToT or draft-topology file, a program spec or an option's value, or a
    request the KV cache or the model cannot hold (a prompt longer than the pool, a decode
    step with no free page). A ValueError, so that code catching ValueError still does.

    python -m treeattn.engine prints an InputError as one line and exits 2; every other
    exception, a ValueError or TypeError of the checks on how the library calls itself
    included, is a bug there and propagates with its traceback."""


def read_json(path, what=None):
    """A file's JSON; InputError starting with `what` (else the path) when the file cannot
    be read or parsed."""
    where = f"{what}: {path!r}" if what else str(path)
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e})") from e
    except (ValueError, RecursionError) as e:   # JSONDecodeError, UnicodeDecodeError, deep nesting
        raise InputError(f"{where}: malformed JSON ({e})") from e


@contextlib.contextmanager
def allocating(what, device):
    """An allocation sized by the caller's input (a pool, a model) that fails is their
    mistake: InputError "{what} cannot be allocated on {device}". Only a failed allocation
    (torch.OutOfMemoryError, the CPU allocator's RuntimeError, MemoryError) is converted."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if not (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e)):
            raise
        raise InputError(f"{what} cannot be allocated on {device}: {e}") from e


@contextlib.contextmanager
def refused(what):
    """A library call's ValueError (its own limits: int32 fields, node counts) or
    MemoryError on sizes the caller chose, as InputError "{what}: ..."."""
    try:
        yield
    except InputError:
        raise
    except (ValueError, MemoryError) as e:
        raise InputError(f"{what}: {e}") from e


def host_memory():
    """Bytes of this host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_program_size(what, token_ids, kv_tokens, max_kv_tokens=None):
    """A program's sizes, checked before any of its tokens is made: its prompts' token id
    lists (`token_ids` list slots, 8 bytes each at least) must fit this host's memory, and
    the KV tokens its sequences hold at least (`kv_tokens`) the most the device holds
    (kv.max_kv_tokens; None: unchecked). A size typed with zeros too many would otherwise
    fill the host's memory with token lists, or loop for hours, before any other check."""
    if 8 * token_ids > host_memory():
        raise InputError(f"{what}: its prompts hold {token_ids} token ids, more than this host's "
                         f"memory holds ({host_memory() // 8} at 8 bytes each)")
    if max_kv_tokens is not None and kv_tokens > max_kv_tokens:
        raise InputError(f"{what}: its sequences hold at least {kv_tokens} KV tokens, more than "
                         f"the device's memory holds for this model ({max_kv_tokens})")
