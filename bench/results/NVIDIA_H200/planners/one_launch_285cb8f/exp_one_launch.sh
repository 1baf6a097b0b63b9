#!/bin/bash
# Experiment: node's plans with every unit on the plan's largest Q tile (one attention launch) vs node.
set -e
B=build/device
if [ ! -x $B/treeattn ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
fi
cmake --build $B -j16 --target treeattn_cli > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
python3 - <<'PY'
import json, subprocess, os
multi = json.load(open('exp_multi.json'))
out = {}
for rnd in range(2):
  for heads, ws in multi.items():
    for var, extra in (('node', []), ('one', ['--plan-opt', 'one_launch=1'])):
      args = ['build/device/treeattn', 'bench', '--heads', heads, '-p', 'node', '--json', '--verify', '2'] + extra
      for w in ws: args += ['-w', w]
      r = subprocess.run(args, capture_output=True, text=True)
      if r.returncode != 0:
        print(r.stderr[-2000:]); raise SystemExit(1)
      for rec in json.loads(r.stdout):
        out.setdefault(f"{rec['workload']}|{heads}", {}).setdefault(var, []).append((rec['us'], rec['us_graph'], rec['launch_info']))
json.dump(out, open(os.environ['OUT'] + '/one_launch.json', 'w'), indent=0)
import math
g = []; ge = []
for k, v in out.items():
  a = sorted(x[0] for x in v['node']); b = sorted(x[0] for x in v['one'])
  r = min(b) / min(a); g.append(math.log(r))
  print(f"{k[:70]:70s} node {min(a):7.1f} one {min(b):7.1f} {r:.3f}")
print('geomean one/node', math.exp(sum(g) / len(g)), 'n', len(g))
PY
