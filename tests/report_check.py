#!/usr/bin/env python3
"""Checks `flowrun report`'s output against the metrics file and the run's printed lines
(tests/report_small.sh). Standard library only.

usage: report_check.py METRICS.jsonl REPORT_DIR RUN_LOG

- the metrics file: every line JSON; signal records and snapshot lines; the last line the final snapshot;
- every SVG parses as XML (xml.etree); it has one polyline per (node, signal, replica) with a
  record at step >= 0 and a finite value, and that polyline has exactly that many points,
  every one inside the panel's plot box (the <rect> drawn before it in its panel);
- REPORT.md's ppo_controller table: the last reward is the last "[step 3 ppo] iter K reward X"
  line's X (printed with 4 decimals), the first reward the first iteration's, and the held-out
  reward row "before → after" is the two "[step 3 ppo] held-out before/after: mean reward X" lines'.
"""
import collections
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

metrics, report_dir, log = sys.argv[1:4]
SVG = "{http://www.w3.org/2000/svg}"

want = collections.Counter()  # (node, signal, replica) -> records with a step and a finite value
lines = [json.loads(l) for l in open(metrics) if l.strip()]
signals = [l for l in lines if "signal" in l]
snapshots = [l for l in lines if "nodes" in l]
assert snapshots and snapshots[-1] is lines[-1] and lines[-1]["final"], "the last line is not the final snapshot"
assert signals, "no signal records in " + metrics
for s in signals:
    assert set(s) >= {"signal", "node", "replica", "step", "value", "t"}, s
    if s["step"] >= 0 and s["value"] is not None:
        want[(s["node"], s["signal"], s["replica"])] += 1
for n in ("sft", "rm", "ppo_controller"):
    assert any(k[0] == n for k in want), "no signal records of " + n

got = {}
for name in sorted(os.listdir(report_dir)):
    if not name.endswith(".svg"):
        continue
    root = ET.parse(os.path.join(report_dir, name)).getroot()  # raises on malformed XML
    assert root.tag == SVG + "svg", name
    for g in root.iter(SVG + "g"):
        rect = g.find(SVG + "rect")
        for pl in g.iter(SVG + "polyline"):
            key = (pl.get("data-node"), pl.get("data-signal"), int(pl.get("data-replica")))
            assert key not in got, "two polylines for %s" % (key,)
            pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
            x0, y0 = float(rect.get("x")), float(rect.get("y"))
            x1, y1 = x0 + float(rect.get("width")), y0 + float(rect.get("height"))
            for x, y in pts:
                assert x0 - 0.01 <= x <= x1 + 0.01 and y0 - 0.01 <= y <= y1 + 0.01, (key, x, y, x0, y0, x1, y1)
            got[key] = len(pts)
assert got == dict(want), "polylines %s != records %s" % (got, dict(want))
print("report_check: %d polylines, %d points, as many as the signal records" % (len(got), sum(got.values())))

# REPORT.md against the printed lines
md = open(os.path.join(report_dir, "REPORT.md")).read()
section = md.split("\n## ppo_controller\n", 1)[1].split("\n## ", 1)[0]
rows = {}
for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 9 and cells[0] not in ("signal", "---"):
        rows[cells[0]] = cells
printed = re.findall(r"\[step 3 ppo\] iter (\d+) reward (-?[0-9.]+)", open(log).read())
assert printed, "no [step 3 ppo] iter lines in " + log
reward = rows["reward"]
assert int(reward[1]) == len(printed), (reward, printed)
first, last = float(reward[2]), float(reward[3])
# the log prints 4 decimals (off by up to 5e-5) and the table 6 significant digits (up to 5e-6 here):
# the two roundings of one value differ by up to 5.5e-5 (-1.117449 prints -1.1174 and -1.11745)
tol = 5.5e-5 + 1e-9
assert abs(first - float(printed[0][1])) <= tol, (first, printed[0])
assert abs(last - float(printed[-1][1])) <= tol, (last, printed[-1])
held = re.findall(r"\[step 3 ppo\] held-out (before|after): mean reward (-?[0-9.]+)", open(log).read())
assert [h[0] for h in held] == ["before", "after"], held
values = [float(v) for v in rows["held_out/reward"][7].split("→")]
assert len(values) == 2 and all(abs(v - float(h[1])) <= tol for v, h in zip(values, held)), (values, held)
print("report_check: last reward %s (printed iter %s: %s), held-out %s -> %s (printed %s -> %s)" %
      (reward[3], printed[-1][0], printed[-1][1], values[0], values[1], held[0][1], held[1][1]))
