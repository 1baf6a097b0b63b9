# Throwaway for the engine branch: puts python/ on sys.path so `treeattn.engine` imports
# from the source tree; registers the gpu marker (tests needing CUDA are skipped without it).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device")

# tiny models on a shared 2-core machine: one thread avoids oversubscription stalls
import torch  # noqa: E402

torch.set_num_threads(1)
