import json, sys
ab = json.load(open('bench/results/NVIDIA_H200/planners/join_launches_ab/join.json'))
def load(paths):
    A = {}
    for p in paths:
        for r in json.load(open(p))['records']:
            A[(r['workload'].replace('/work/main/', ''), f"{r['num_qo_heads']}/{r['num_kv_heads']}", r['planner'])] = r['us']
    return A
for name, paths in (('suites', [f'bench/results/NVIDIA_H200/suites_4b2eff3/{s}/results.json' for s in ['fasttree','pat','deft','flashforge']]),
                    ('offsuite', ['bench/results/NVIDIA_H200/offsuite_4b2eff3/offsuite/results.json'])):
    A = load(paths)
    planners = sorted(set(p for (_, _, p) in A))
    c = [[0, 0], [0, 0]]; n = 0
    for (w, h) in sorted(set((w, h) for (w, h, _) in A)):
        t = {p: A[(w, h, p)] for p in planners}; s = dict(t); n += 1
        for p in ('auto', 'node'):
            v = ab.get(f"{w}|{h}|{p}")
            if v: s[p] = t[p] * min(x[0] for x in v['join']) / min(x[0] for x in v['off'])
        for i, x in enumerate((t, s)):
            c[i][0] += x['auto'] <= 1.03 * min(x['node'], x['per-query'])
            c[i][1] += x['auto'] <= 1.05 * min(x[p] for p in planners)
        a1 = t['auto'] <= 1.03 * min(t['node'], t['per-query']); b1 = s['auto'] <= 1.03 * min(s['node'], s['per-query'])
        if a1 != b1: print(' ', name, w[:50], h, 'c1', a1, '->', b1, f"auto {t['auto']:.1f}->{s['auto']:.1f} node {t['node']:.1f}->{s['node']:.1f} pq {t['per-query']:.1f}")
    print(name, n, 'criterion 1, 2 before', c[0], 'after', c[1])
