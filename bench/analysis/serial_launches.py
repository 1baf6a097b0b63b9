"""Offline test (2026-11-29): auto's linear table with `launches` counting only the launches that wait for CTA slots
(a launch after earlier ones whose CTAs, as fractions of their resident slots, already fill the GPU), refitted by
fit_auto_cost.py's NNLS on fasttree + pat + deft and scored as bench/analysis/auto_cost_forms.py scores (decisions
within 1.03x of the faster of the timed plans). Run from the repository root: python3 bench/analysis/serial_launches.py
Results: serial_launches_results.txt."""
import sys, os, collections
import numpy as np
sys.path.insert(0, 'bench/analysis'); sys.path.insert(0, 'scripts')
import auto_cost_data as D
import auto_cost_forms as F
_orig = D.launch_features


def launch_features_with_fill(rec):
    # each launch's CTAs as a fraction of its resident slots (capped at 1): how much of the GPU it holds
    f = _orig(rec)
    ls, _ = D.parse_launch_info(rec["launch_info"], rec["units"], rec["num_kv_heads"])
    f["launch_fill"] = [min(1.0, c / r) for _, c, r, _ in ls]
    return f


D.launch_features = launch_features_with_fill
recs, drops, extra = D.load_records()
plans = F.build_plans(recs, 'us')
def serial(f):
    n, filled = 1, 0.0
    for i, fi in enumerate(f['launch_fill']):
        if i > 0 and filled >= 0.999: n += 1
        filled += fi
    return n
cnt = collections.Counter()
for p in plans:
    s = serial(p['f']); cnt[(int(p['f']['launches']), s)] += 1
print('(launches, serial) counts:', sorted(cnt.items())[:20])
sels = {"train": lambda p: p["set"] == "train", "h100": lambda p: p["set"] == "h100", "h200": lambda p: p["set"] == "h200"}
def run(tag):
    X = F.matrix(plans)
    rows = []
    for name, (coef, n) in (('nnls-3suites', F.nnls_fit(plans, {"fasttree", "pat", "deft"})),):
        m = F.Fixed(name, coef, '')
        pred = m.predict(X)
        sc = {k: F.score(plans, pred, s, scale_fit=(k != 'train')) for k, s in sels.items()}
        print(tag, name, 'launches coef %.3f' % coef['launches'], ' '.join(f"{k} {v['hits']}/{v['n']}" for k, v in sc.items()))
    m = F.Fixed('shipped', F.SHIPPED, '')
    pred = m.predict(X)
    sc = {k: F.score(plans, pred, s, scale_fit=(k != 'train')) for k, s in sels.items()}
    print(tag, 'shipped-coefs', ' '.join(f"{k} {v['hits']}/{v['n']}" for k, v in sc.items()))
    return sc
base = run('launches=all')
for p in plans:
    p['f'] = dict(p['f']); p['f']['launches'] = serial(p['f'])
new = run('launches=serial')
