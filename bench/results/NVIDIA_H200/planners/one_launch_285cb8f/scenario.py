#!/usr/bin/env python3
"""Goal 1's criteria on the four suites (H200, suites_4b2eff3) if node's plan were promoted to one launch
wherever its CTAs then fit one wave of the largest tile (the 39 'one wave' configs of one_launch.json) and auto
took that plan there. The promoted time is this run's, scaled by suites_4b2eff3's node time over this run's.
Run from the repository root: python3 bench/results/NVIDIA_H200/planners/one_launch_285cb8f/scenario.py"""
import json, os, re
here = os.path.dirname(os.path.abspath(__file__))
res = json.load(open(os.path.join(here, 'one_launch.json')))
A = {}
for s in ['fasttree', 'pat', 'deft', 'flashforge']:
    d = json.load(open(os.path.join(here, '..', '..', 'suites_4b2eff3', s, 'results.json')))
    for r in d['records']:
        A[(r['workload'].replace('/work/main/', ''), f"{r['num_qo_heads']}/{r['num_kv_heads']}", r['planner'])] = r['us']
planners = ['per-query', 'auto', 'node', 'node-chunk', 'flatten', 'fasttree', 'pat', 'forge']
def one_wave(info):
    return sum(int(x) for x in re.findall(r'ctas=(\d+)', info.split('merge')[0])) <= 264 and 'persistent' not in info
c = [[0, 0], [0, 0]]
for (w, h) in sorted(set((w, h) for (w, h, p) in A)):
    t = {p: A[(w, h, p)] for p in planners}
    s = dict(t)
    k = f"{w}|{h}"
    if k in res and one_wave(res[k]['one'][0][2]):
        s['node'] = s['auto'] = min(x[0] for x in res[k]['one']) * t['node'] / min(x[0] for x in res[k]['node'])
    for i, x in enumerate((t, s)):
        c[i][0] += x['auto'] <= 1.03 * min(x['node'], x['per-query'])
        c[i][1] += x['auto'] <= 1.05 * min(x[p] for p in planners)
    if (t['auto'] <= 1.03 * min(t['node'], t['per-query'])) != (s['auto'] <= 1.03 * min(s['node'], s['per-query'])) or \
       (t['auto'] <= 1.05 * min(t[p] for p in planners)) != (s['auto'] <= 1.05 * min(s[p] for p in planners)):
        print(f"{k[:62]:62s} auto {t['auto']:6.1f} -> {s['auto']:6.1f}")
print('criterion 1, 2 as measured:', c[0], ' with the promoted plans:', c[1])
