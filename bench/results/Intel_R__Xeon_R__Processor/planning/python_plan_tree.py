# plan() from Python on the CPU path: bench_runtime.py's 1000-node / 256-query tree,
# median of 300 plan_tree calls (numpy arrays), device="cpu" (no pack).
#   python3 python_plan_tree.py DIR_HOLDING_THE_TREEATTN_PACKAGE
import os, sys
sys.path.insert(0, sys.argv[1])  # the treeattn package to time
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "runtime"))
import treeattn
from bench_runtime import serving_tree, median_host_us, H, HKV, D, PAGE, DT
print("treeattn from", treeattn.__file__)
arrays, pages = serving_tree(1000, 256)
attn = treeattn.TreeAttention(H, HKV, D, PAGE, pages, dtype=DT, device="cpu", max_queries=256, max_nodes=4096,
                              max_page_refs=pages)
for _ in range(20): attn.plan_tree(**arrays)
runs = [median_host_us(lambda: attn.plan_tree(**arrays), 300) for _ in range(3)]
print("pages", pages, "plan_tree us (3 medians of 300):", " ".join(f"{r:.1f}" for r in runs))
