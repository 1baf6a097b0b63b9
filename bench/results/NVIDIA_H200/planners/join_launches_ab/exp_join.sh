#!/bin/bash
# A/B: node's one-launch rule (join_launches, default 1) against join_launches=0, auto and node, on the configs whose plans it changes.
set -e
B=build/device
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build $B -j16 --target treeattn_cli > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
python3 - <<'PY'
import json, subprocess, os, math
cfg = json.load(open('exp_join.json'))
out = {}
for rnd in range(2):
  for heads, ws in cfg.items():
    for var, extra in (('join', []), ('off', ['--plan-opt', 'join_launches=0'])):
      args = ['build/device/treeattn', 'bench', '--heads', heads, '-p', 'auto', '-p', 'node', '-p', 'per-query', '--json', '--verify', '2'] + extra
      for w in ws: args += ['-w', w]
      r = subprocess.run(args, capture_output=True, text=True)
      if r.returncode != 0: print(r.stderr[-3000:]); raise SystemExit(1)
      for rec in json.loads(r.stdout):
        out.setdefault(f"{rec['workload']}|{heads}|{rec['planner']}", {}).setdefault(var, []).append((rec['us'], rec['us_graph'], rec['launch_info'], rec['units']))
json.dump(out, open(os.environ['OUT'] + '/join.json', 'w'), indent=0)
for k, v in sorted(out.items()):
  a = min(x[0] for x in v['off']); b = min(x[0] for x in v['join'])
  if v['off'][0][2] == v['join'][0][2] and v['off'][0][3] == v['join'][0][3]: continue
  print(f"{k[:78]:78s} off {a:7.1f} join {b:7.1f} {b/a:.3f}")
PY
