#!/usr/bin/env python3
"""The host a bench result was measured on: CPU model, widest SIMD ISA and core count.

report.py keeps one baseline per machine type, "<cpu> | <isa>", so the CPU model must tell
machine types apart. On cloud hosts the model name often does not: every AMD EPYC generation
(Zen 3 family 25 model 1, Zen 4 family 25 model 17, Zen 5 family 26 model 2) reads "AMD EPYC",
and a Zen 5 run was compared with the Zen 4 baseline. So on x86 the model name is followed by
its CPUID family and model, e.g. "AMD EPYC (family 26 model 2)".

Used by bench/run_bench.sh (`python3 bench/host.py` prints the results file's host line) and
bench/trl_ppo.py (imports host()). Reads /proc/cpuinfo, and lscpu for a model name cpuinfo lacks
(ARM); a field it cannot read is "unknown". `python3 bench/host.py FILE` reads FILE instead, alone
(no lscpu: the line describes the file), and stops with exit 2 when FILE cannot be read.
"""
import json
import os
import subprocess
import sys


def cpuinfo(path="/proc/cpuinfo", strict=False):
    """The first value of each /proc/cpuinfo field, keyed by its name (the first CPU's block).
    An unreadable file gives {} (raises OSError when strict); bytes that are not UTF-8 are replaced."""
    fields = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    fields.setdefault(k.strip(), v.strip())
    except OSError:
        if strict:
            raise
    return fields


def isa_of(flags):
    """The widest SIMD ISA in a cpuinfo flags (x86) or Features (ARM) string: scalar, sse4,
    avx2 (avx2-nofma without FMA), avx512, neon or sve."""
    f = set(flags.split())
    isa = "scalar"
    for flag, name in (("sse4_2", "sse4"), ("avx2", "avx2"), ("avx512f", "avx512"), ("asimd", "neon"), ("sve", "sve")):
        if flag in f:
            isa = name
    if isa == "avx2" and "fma" not in f:
        isa = "avx2-nofma"
    return isa


def lscpu_model():
    """lscpu's "Model name" (ARM kernels' cpuinfo has none), or "" where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, errors="replace", timeout=10,
                             env=dict(os.environ, LC_ALL="C")).stdout  # English field names
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return ""


def cores():
    """The cores this process may run on (as nproc counts them: the affinity mask, not the machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host(path=None):
    """{"cpu", "isa", "cores"} of this machine (cpu: model name, plus "(family F model M)" on x86).
    With path, that cpuinfo file alone describes the CPU (OSError when it cannot be read)."""
    c = cpuinfo(path, strict=True) if path else cpuinfo()
    cpu = c.get("model name") or c.get("Model name") or c.get("Hardware") or ("" if path else lscpu_model())
    cpu = cpu or "unknown"
    if "cpu family" in c and "model" in c:
        cpu = f'{cpu} (family {c["cpu family"]} model {c["model"]})'
    return {"cpu": cpu, "isa": isa_of(c.get("flags") or c.get("Features") or ""), "cores": cores()}


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        print("usage: bench/host.py [CPUINFO_FILE]: the bench's host line (JSON) for this machine or that file",
              file=sys.stderr)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    try:
        print(json.dumps({"kind": "host", **host(*sys.argv[1:2])}))
    except OSError as e:
        print(f"host.py: cannot read {sys.argv[1]}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
