# pytest set-up for the Python tests: they import the installed treeattn
# package (pip install . in scripts/test.sh, or PYTHONPATH=<build>/python after
# a CMake build with -DTREEATTN_PYTHON=ON); tests marked gpu skip themselves
# without a CUDA device.
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # the tests' own helpers (hf_models)
# JAX (the DLPack test) must not take most of the GPU's memory from PyTorch
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# tiny models on a 2-core machine: one thread avoids oversubscription stalls
import torch  # noqa: E402

torch.set_num_threads(1)
