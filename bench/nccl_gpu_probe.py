"""The GPU proof's look at the machine: the plugin build, the preflight probe and its one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import nccl_gpu_plan as plan

TOOLS = ("make", "cc", "gcc", "ip", "tc", "mpirun", "nvidia-smi", "nvidia-cuda-mps-control")


def compiler() -> str | None:
    """The C compiler make would use: $CC, else gcc, else cc (native/Makefile's order)."""
    for cc in (os.environ.get("CC"), "gcc", "cc"):
        if cc and shutil.which(cc):
            return cc
    return None


def build_plugin(build: Path, prebuilt: bool = False) -> str:
    """make the libraries and the reducer when make and a compiler exist (unless `prebuilt`); else use
    the ones built elsewhere. Returns a note for the report; RuntimeError when there is no library to use."""
    libs = [build / plan.NET_LIB, build / plan.TUNER_LIB]
    have = all(p.is_file() for p in libs)
    if prebuilt:
        if not have:
            missing = ", ".join(str(p) for p in libs if not p.is_file())
            raise RuntimeError(f"--prebuilt: no plugin at {missing}: `make -C native plugins`, copy native/build")
        return "prebuilt plugin libraries (--prebuilt: not rebuilt here)"
    if shutil.which("make") and compiler():
        proc = subprocess.run(["make", "-C", str(plan.NATIVE), "plugins"], capture_output=True, text=True)
        if proc.returncode == 0:
            return "plugin built here with make"
        if not have:
            raise RuntimeError(f"building the plugin failed:\n{proc.stderr.strip()[-2000:]}")
        return f"make failed ({proc.stderr.strip().splitlines()[-1:] or ['?']}); using the libraries already built"
    if not have:
        missing = ", ".join(str(p) for p in libs if not p.is_file())
        raise RuntimeError(f"no plugin at {missing} and no make/C compiler to build it: run `make -C native plugins` "
                           "on an x86-64 machine and copy native/build here")
    return "prebuilt plugin libraries (no make or C compiler here)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a CUDA context, not only a device count: under MPS that is what connects to the MPS server
_PROBE = r"""
import json, sys
info = {}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        info["gpus"] = torch.cuda.device_count()
        info["gpu"] = torch.cuda.get_device_name(0)
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        info["cuda_runtime"] = torch.version.cuda
        info["context"] = float(torch.ones(4, device="cuda").sum().item()) == 4.0
except Exception as e:
    info["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(info))
"""


def preflight(python: str, env: dict[str, str] | None = None, mps: bool = False) -> dict:
    """What the machine has: torch, CUDA, the GPU, NCCL's version, the driver, its compute mode,
    and which tools exist; the probe runs with `env` added (MPS's pipes). `problem` is set when
    the proof cannot run at all."""
    info: dict = {"tools": {t: bool(shutil.which(t)) for t in TOOLS}}
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=90 if mps else 120,
                              env=dict(os.environ, **(env or {})))
        info.update(json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else
                    {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]})
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        info["error"] = f"{python}: {e}"
    if info["tools"]["nvidia-smi"]:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,compute_mode", "--format=csv,noheader"],
                           capture_output=True, text=True)
        if q.returncode == 0 and q.stdout.strip():
            info["driver"], _, mode = q.stdout.strip().splitlines()[0].partition(", ")
            info["compute_mode"] = mode.strip()
    if "error" in info:
        info["problem"] = f"{python} cannot use torch with CUDA: {info['error']}"
    elif not info.get("cuda"):
        info["problem"] = "no CUDA GPU visible to torch (this proof needs one NVIDIA GPU)"
    elif not mps and info.get("compute_mode", "Default").replace("_", " ").lower().startswith("exclusive"):
        info["problem"] = (f"GPU compute mode is {info['compute_mode']}: the ranks share one GPU, which needs "
                           "Default (nvidia-smi -c DEFAULT) or CUDA MPS")
    return info


def preflight_line(info: dict, mode: str, note: str, mps: str = "off") -> str:
    tools = " ".join(f"{t}:{'yes' if ok else 'no'}" for t, ok in info["tools"].items())
    return (f"preflight: GPU {info.get('gpu', '?')} x{info.get('gpus', '?')}, driver {info.get('driver', '?')}, "
            f"compute mode {info.get('compute_mode', '?')}, torch {info.get('torch', '?')} "
            f"(CUDA {info.get('cuda_runtime', '?')}), NCCL {info.get('nccl', '?')}; {tools}; mode {mode}: {note}; "
            f"MPS {mps}")
