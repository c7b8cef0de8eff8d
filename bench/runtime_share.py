#!/usr/bin/env python3
"""The actor runtime's share of a job's CPU time (issue 19's "actor-runtime overhead < 2% of a
PPO iteration"), from `perf record` with DWARF call stacks.

  bench/runtime_share.py [--freq HZ=1000] [--keep FILE] [--label TEXT] -- COMMAND...
  e.g. bench/runtime_share.py -- build/bin/flowrun graphs/ppo.graph --no-progress --set ...
  (bench/run_bench.sh runs it on graphs/ppo.graph, one line per model, for its goals table)

Runs COMMAND under `perf record -e cpu-clock --call-graph dwarf` (Linux perf; a
perf_event_paranoid of 2 is enough for one's own processes), then files every sample by
its whole call stack, first rule that matches:
  - start-up: the dynamic loader or the CUDA libraries (loaded even on a CPU-only run);
  - openmp: a libgomp frame at the leaf (the team's barriers and waits, spinning or asleep);
  - kernels: any frame of flowrun's kernels (flowrun::simd, flowrun::ops, the CPU backend,
    the decoder), of a GEMM library (BLIS, OpenBLAS, oneDNN: their stacks often outrun perf's
    16 KB copy before a flowrun frame), or a libgomp frame above the leaf (a kernel's parallel body);
  - actor runtime: a CAF frame and no frame of a node's own code (only flowrun::rt, comm
    and graph frames besides CAF and the standard library), or a clock_nanosleep with no
    node frame: CAF's workers poll their queues with short sleeps (comm::configure_scheduler);
  - node code: the rest under CAF (tokenizing prompts, sampling, JSON, the loss math);
  - other: everything else (malloc, memcpy outside the above, the shell).
Prints the shares as a table and one JSON line {"kind": "runtime_share", ...}.
CPU samples, not wall time: an idle wait costs nothing here, a busy poll does.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

NODE_EXEMPT = re.compile(r"(flowrun::rt::|flowrun::actor::|flowrun::comm::|flowrun::graph::|caf::|std::|void caf|"
                         r"flowrun::\(anonymous namespace\)::(replica|coord|blocking))")
KERNEL = re.compile(r"flowrun::(simd::|ops::|cpu_gemm::|decoder::|\(anonymous namespace\)::cpu_backend_impl)")
# a GEMM library's own frames: BLIS (linked into the binary), OpenBLAS, oneDNN. Their call stacks are
# deep enough that perf's 16 KB stack copy often ends before flowrun's frames are reached
GEMM_LIB = re.compile(r"^(bli_|sgemm_|cblas_|dnnl_|dnnl::)")
GEMM_DSO = ("libblis", "libopenblas", "libdnnl")


def parse(script_text):
    """perf script output (-F comm,tid,ip,sym,dso) -> [[(sym, dso basename), ...] leaf first]."""
    samples, cur = [], None
    for line in script_text.splitlines():
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
            continue
        if not line[0].isspace():
            if cur:
                samples.append(cur)
            cur = []
            continue
        m = re.match(r"\s*[0-9a-f]+\s+(.*)\s+\((.*)\)\s*$", line)
        if m and cur is not None:
            cur.append((m.group(1).strip(), os.path.basename(m.group(2))))
    if cur:
        samples.append(cur)
    return [s for s in samples if s]


def classify(frames):
    syms = [s for s, _ in frames]
    dsos = [d for _, d in frames]
    user = [(s, d) for s, d in frames if "kernel" not in d]
    if any(d.startswith(("ld-linux", "libcuda", "libcublas", "libcudart", "libnccl")) for d in dsos):
        return "start-up"
    if user and user[0][1].startswith("libgomp"):
        return "openmp"
    if any(KERNEL.search(s) or GEMM_LIB.match(s) for s in syms) or \
            any(d.startswith(("libgomp",) + GEMM_DSO) for d in dsos):
        return "kernels"
    flowrun_frames = [s for s, d in frames if d in ("flowrun", "libflowrun_core.so")]
    node = [s for s in flowrun_frames if not NODE_EXEMPT.match(s)]
    if not node and any("clock_nanosleep" in s for s in syms):
        return "actor runtime"
    if any(d.startswith("libcaf") for d in dsos):
        return "node code" if node else "actor runtime"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--freq", type=int, default=1000, help="samples per second per CPU (perf -F)")
    ap.add_argument("--keep", help="keep perf's data file here")
    ap.add_argument("--label", help="what was run, copied into the JSON line (bench/run_bench.sh: the model)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command (put it after --)")
    if a.keep:
        data = a.keep
    else:
        with tempfile.NamedTemporaryFile(suffix=".perf", delete=False) as f:
            data = f.name
    rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(a.freq), "--call-graph", "dwarf,16384",
                          "-o", data, "--"] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if rec.returncode != 0:
        sys.stderr.write(rec.stderr[-4000:])
        sys.exit(f"runtime_share: the command (or perf record) exited {rec.returncode}")
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,ip,sym,dso"], capture_output=True,
                          text=True).stdout
    if not a.keep:
        os.unlink(data)
    samples = parse(text)
    if not samples:
        sys.exit("runtime_share: perf recorded no samples")
    counts = collections.Counter(classify(s) for s in samples)
    n = len(samples)
    steady = n - counts["start-up"]
    print(f"| class | share of {n} samples | share without start-up |\n|---|---|---|")
    for k in ("kernels", "openmp", "node code", "actor runtime", "other", "start-up"):
        print(f"| {k} | {100 * counts[k] / n:.2f}% | " +
              (f"{100 * counts[k] / steady:.2f}% |" if k != "start-up" and steady else "|"))
    line = {"kind": "runtime_share", "samples": n, "share": {k: counts[k] / n for k in counts},
            "runtime_share_steady": counts["actor runtime"] / steady if steady else None}
    if a.label:
        line["label"] = a.label
    print(json.dumps(line))


if __name__ == "__main__":
    main()
