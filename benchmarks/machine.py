"""What machine a benchmark ran on, in one line for its printout: the CPU's model and the
vector extensions that move its numbers (AVX-512, its bf16), the cores this process may use,
and torch. "The project's 2-core box" has been more than one CPU (Zen 4 with AVX-512, Zen 3
without, a main-job step about 2.3x apart), so a recorded number names its CPU."""

from __future__ import annotations

import os
import platform


def cpu() -> str:
    """``model name``, family and model numbers (a VM's "AMD EPYC" hides the generation) and
    the flags that matter here, from /proc/cpuinfo's first CPU (Linux), else what `platform`
    knows."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first CPU's block is enough
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
    except OSError:
        pass
    model = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info:
        model += f" family {info['cpu family']} model {info.get('model', '?')}"
    flags = set(info.get("flags", "").split())
    ext = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(ext) or 'no AVX2 reported'})"


def describe() -> str:
    import torch

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU {cpu()}, {n} cores, torch {torch.__version__}"


if __name__ == "__main__":
    print(describe())
