#!/usr/bin/env python3
"""Per-config table of an A/B log written by scripts/medusa_ab.sh (its "### round R bin
LABEL heads H" blocks and the `treeattn bench` lines under them): each config's fastest
time per binary (the min over rounds of the medians), the ratio of every other binary to
the first label, and the geomean of each ratio.

  scripts/ab_table.py ab.txt base new      (scripts/device_kernel_ab.sh)
  scripts/ab_table.py ab.txt v0 v1 v2      (scripts/env_ab.sh)
  COLUMN=graph scripts/ab_table.py ...     the graph replay's time (medusa_ab.sh GRAPH=1)

Workload paths under $TREEATTN_DATA_DIR/workloads/ are shortened to their file names."""
import collections
import os
import re
import statistics
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    path, labels = sys.argv[1], sys.argv[2:]
    graph = os.environ.get("COLUMN", "us") == "graph"
    prefix = os.environ.get("TREEATTN_DATA_DIR", "") + "/workloads/"
    times = collections.defaultdict(list)
    cur = label = heads = None
    for line in open(path):
        m = re.match(r"### round \d+ bin (\S+) heads (\S+)", line)
        if m:
            label, heads = m.groups()
            continue
        m = re.match(r"([a-z]+:\S+) ", line)
        if m:
            cur = m.group(1).replace(prefix, "")
            continue
        # "  auto  <units> <launches> <us> <us graph> ...": the time is the third
        # number, the graph replay's the fourth.
        m = re.match(r"\s+auto\s+\d+\s+\d+\s+([0-9.]+)\s+([0-9.na]+)", line)
        if m and cur:
            t = float(m.group(2 if graph else 1))
            if t == t:
                times[(cur, heads, label)].append(t)
    ref, others = labels[0], labels[1:]
    ratios = collections.defaultdict(list)
    print(f"{'config':60s} {'heads':6s} " + " ".join(f"{l + ' us':>9s}" for l in labels) + "  " +
          " ".join(f"{l + '/' + ref:>9s}" for l in others))
    for w, h in sorted({(w, h) for (w, h, _) in times}):
        x = {l: min(times[(w, h, l)]) for l in labels if times.get((w, h, l))}
        if ref not in x:
            continue
        for l in others:
            if l in x:
                ratios[l].append(x[l] / x[ref])
        print(f"{w[:60]:60s} {h:6s} " + " ".join(f"{x.get(l, float('nan')):9.1f}" for l in labels) + "  " +
              " ".join(f"{x[l] / x[ref] if l in x else float('nan'):9.3f}" for l in others))
    for l in others:
        if ratios[l]:
            print(f"geomean {l}/{ref} over {len(ratios[l])}: {statistics.geometric_mean(ratios[l]):.3f}")


if __name__ == "__main__":
    main()
