#!/usr/bin/env python3
"""The host a bench result was measured on: CPU model, widest SIMD ISA and core count.

report.py keeps one baseline per machine type, "<cpu> | <isa>", so the CPU model must tell
machine types apart. On cloud hosts the model name often does not: every AMD EPYC generation
(Zen 3 family 25 model 1, Zen 4 family 25 model 17, Zen 5 family 26 model 2) reads "AMD EPYC",
and a Zen 5 run was compared with the Zen 4 baseline. So on x86 the model name is followed by
its CPUID family and model, e.g. "AMD EPYC (family 26 model 2)".

Used by bench/run_bench.sh (`python3 bench/host.py` prints the results file's host line) and
bench/trl_ppo.py (imports host()). Reads /proc/cpuinfo; a field it cannot read is "unknown".
"""
import json
import os
import subprocess
import sys


def cpuinfo(path="/proc/cpuinfo"):
    """The first value of each /proc/cpuinfo field, keyed by its name (the first CPU's block)."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    fields.setdefault(k.strip(), v.strip())
    except OSError:
        pass
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
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return ""


def host(path="/proc/cpuinfo"):
    """{"cpu", "isa", "cores"} of this machine (cpu: model name, plus "(family F model M)" on x86)."""
    c = cpuinfo(path)
    cpu = c.get("model name") or c.get("Model name") or c.get("Hardware") or lscpu_model() or "unknown"
    if "cpu family" in c and "model" in c:
        cpu = f'{cpu} (family {c["cpu family"]} model {c["model"]})'
    return {"cpu": cpu, "isa": isa_of(c.get("flags") or c.get("Features") or ""), "cores": os.cpu_count()}


if __name__ == "__main__":
    print(json.dumps({"kind": "host", **host(*sys.argv[1:2])}))
