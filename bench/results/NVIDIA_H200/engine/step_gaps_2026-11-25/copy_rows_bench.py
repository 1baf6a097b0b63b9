import time, torch, sys
sys.path.insert(0, "build/device/python")
from treeattn.engine.kv import KVPool
kv = KVPool(32, 28615, 16, 8, 128, torch.device("cuda"), torch.bfloat16)
src = torch.arange(16, 21, device="cuda"); dst = torch.arange(160, 165, device="cuda")
for impl in ("index", "advanced"):  # index: the engine's copy_rows (flat)
    for i in range(3):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20):
            if impl == "index":
                kv.copy_rows(src, dst)
            else:
                for tt in (kv.k, kv.v):
                    rows = kv._rows(tt); rows[:, dst] = rows[:, src]
        torch.cuda.synchronize()
        print(f"copy_rows {impl}: {(time.perf_counter() - t) / 20 * 1e3:.3f} ms per call (host+GPU)")
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); kv.copy_rows(src, dst); e.record(); torch.cuda.synchronize(); print("  GPU ms", s.elapsed_time(e))
