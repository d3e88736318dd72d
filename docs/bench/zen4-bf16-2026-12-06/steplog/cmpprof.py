import pstats
import sys

a, b = pstats.Stats(sys.argv[1]).stats, pstats.Stats(sys.argv[2]).stats
na = sum(v[0] for k, v in a.items() if k[2] == "step" and k[0].endswith("core.py"))
nb = sum(v[0] for k, v in b.items() if k[2] == "step" and k[0].endswith("core.py"))
print("steps", na, nb)
rows = []
for k in set(a) | set(b):
    ta = a.get(k, (0, 0, 0, 0))[2] / na * 1e3
    tb = b.get(k, (0, 0, 0, 0))[2] / nb * 1e3
    rows.append(
        (tb - ta, ta, tb, f"{k[0].split('site-packages/')[-1].split('snap/')[-1]}:{k[1]}({k[2]})")
    )
rows.sort()
for r in rows[-25:][::-1]:
    print(f"{r[0]:+7.3f} ms/step  {r[1]:7.3f} -> {r[2]:7.3f}  {r[3]}")
print("...")
for r in rows[:8]:
    print(f"{r[0]:+7.3f} ms/step  {r[1]:7.3f} -> {r[2]:7.3f}  {r[3]}")
