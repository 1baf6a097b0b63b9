"""The engine's one exception type of its own: InputError, for input from outside the
program that is wrong or cannot be served, and the helpers that raise it where such
input enters a file read, an allocation or a library call."""
import contextlib
import json

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
