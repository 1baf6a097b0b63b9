"""The engine's one exception type of its own: InputError, for input from outside the
program that is wrong or cannot be served, and how to tell an allocation that failed."""
import torch


class InputError(ValueError):
    """What the user gave is wrong or cannot be served: a model folder or name, a config,
    weights, recorded ToT or draft-topology file, a program spec or an option's value, or a
    request the KV cache or the model cannot hold (a prompt longer than the pool, a decode
    step with no free page). A ValueError, so that code catching ValueError still does.

    python -m treeattn.engine prints an InputError as one line and exits 2; every other
    exception, a ValueError or TypeError of the checks on how the library calls itself
    included, is a bug there and propagates with its traceback."""


def out_of_memory(e):
    """Whether e is an allocation that failed (torch.OutOfMemoryError on a GPU, the CPU
    allocator's RuntimeError, MemoryError), not another error of the same type."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e))
