"""`doctor --check gpu|efa` on a real GPU machine: the node program and the parsers, as doctor runs
them, against the real nvidia-smi, the real kernel log and the real NCCL.

The device machine has Python and PyTorch but not clustertool's dependencies (typer, boto3 ...), so
this loads the doctor's stdlib-only modules (gpu, smi, xid, efa, findings) and the node program
builder without the package's __init__ chain.  Three readings:

  idle    the GPUs as they are: a healthy machine must give no warning or error;
  busy    while a matmul loop runs on GPU 0: its process must be seen on that GPU (memory held
          by a process is not "memory with no process") and a loaded GPU must not be called slow;
  count   the idle reading judged as if the node were a p5.48xlarge with 8 slots: the count
          finding must name the missing GPUs (the logic a short node hits).
Then NCCL itself: a one-rank allreduce with NCCL_DEBUG=INFO, its log read by the efa check's parser.

    OUT=dir python3 bench/gpu_health_proof.py     # writes dir/gpu-health-proof.json and .md
"""

from __future__ import annotations

import os.path
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/copy.py is not stdlib copy

import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _load_stdlib_modules():
    """clustertool.doctor.{findings,xid,smi,gpu,efa} and clustertool.nodeprogs, skipping the
    packages' __init__ (which pull in the CLI's dependencies)."""
    for pkg, path in (("clustertool", ROOT / "clustertool"), ("clustertool.doctor", ROOT / "clustertool/doctor")):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(path)]  # type: ignore[attr-defined]
        sys.modules[pkg] = mod
    spec = importlib.util.spec_from_file_location("clustertool.nodeprogs", ROOT / "clustertool/nodeprogs/__init__.py",
                                                  submodule_search_locations=[str(ROOT / "clustertool/nodeprogs")])
    assert spec and spec.loader
    nodeprogs = importlib.util.module_from_spec(spec)
    sys.modules["clustertool.nodeprogs"] = nodeprogs
    spec.loader.exec_module(nodeprogs)
    import importlib as il
    return (nodeprogs, il.import_module("clustertool.doctor.gpu"), il.import_module("clustertool.doctor.smi"),
            il.import_module("clustertool.doctor.efa"))


nodeprogs, gpu, smi, efa = _load_stdlib_modules()


def reading(deep: int) -> tuple[float, str]:
    script = nodeprogs.shell_script("gpu_health", MARK=gpu.MARK, BOX=30, SINCE="", CSV_FIELDS=smi.CSV_FIELDS,
                                    DEEP=deep, DEEP_BOX=150)
    t0 = time.monotonic()
    out = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=400).stdout
    return time.monotonic() - t0, out


def judged(text: str, *, slots: int, instance_type: str = "", deep: int = 0):
    steps = gpu.sections(text)
    found, data = gpu.node_findings("this-node", steps, slots=slots, instance_type=instance_type,
                                    options=gpu.Options(box=30, deep=deep, deep_box=150))
    return [{"severity": f.severity, "message": f.message, "fix": f.fix} for f in found], data, \
        {k: v.rc for k, v in steps.items()}


BUSY = """
import time, torch
x = torch.randn(8192, 8192, device="cuda")
end = time.time() + float(__import__("sys").argv[1])
print("started", flush=True)
while time.time() < end:
    y = x @ x
torch.cuda.synchronize()
"""

NCCL = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl")
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("sum", float(t[0]))
dist.destroy_process_group()
"""


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "gpu-health-proof"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"host": os.uname().nodename}
    has_dcgm = subprocess.run(["sh", "-c", "command -v dcgmi"], capture_output=True).returncode == 0
    deep = 1 if has_dcgm else 0

    secs, idle_text = reading(deep)
    (out_dir / "idle.txt").write_text(idle_text)
    findings, data, rcs = judged(idle_text, slots=len(data_gpus(idle_text)) or 1, deep=deep)
    report["idle"] = {"seconds": round(secs, 2), "steps_rc": rcs, "findings": findings, "gpus": data["gpus"],
                      "kernel_log": data["kernel_log"], "xids": data["xids"], "dcgm_run": bool(deep)}

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(BUSY)
    loop = subprocess.Popen([sys.executable, fh.name, "60"], stdout=subprocess.PIPE, text=True)
    assert loop.stdout is not None
    loop.stdout.readline()  # "started": the tensor is on the GPU
    time.sleep(3)           # utilization is sampled over the last second or so
    secs, busy_text = reading(0)
    loop.kill()
    loop.wait()
    (out_dir / "busy.txt").write_text(busy_text)
    findings, data, rcs = judged(busy_text, slots=len(data_gpus(busy_text)) or 1)
    report["busy"] = {"seconds": round(secs, 2), "loop_pid": loop.pid, "findings": findings, "gpus": data["gpus"],
                      "loop_pid_seen_on_gpu": any(loop.pid in g["pids"] for g in data["gpus"])}

    findings, _, _ = judged(idle_text, slots=8, instance_type="p5.48xlarge")
    report["count_as_p5"] = [f for f in findings if f["severity"] != "info"]

    nccl = subprocess.run([sys.executable, "-c", NCCL], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, NCCL_DEBUG="INFO"))
    (out_dir / "nccl.log").write_text(nccl.stdout + nccl.stderr)
    uses = efa.nccl_net_use(nccl.stdout + nccl.stderr)
    report["nccl"] = {"rc": nccl.returncode, "stdout": nccl.stdout.strip()[-200:],
                      "net_use": {h: {"network": u.network, "provider": u.provider, "nics_found": u.nics_found,
                                      "devices": sorted(u.devices)} for h, u in uses.items()},
                      "findings": [{"severity": f.severity, "message": f.message}
                                   for f in efa.nccl_findings(uses, {h: 4 for h in uses}, "one-rank allreduce")]}
    (out_dir / "gpu-health-proof.json").write_text(json.dumps(report, indent=2))
    ok = (not [f for f in report["idle"]["findings"] if f["severity"] in ("warning", "error")]
          and report["busy"]["loop_pid_seen_on_gpu"]
          and not [f for f in report["busy"]["findings"] if f["severity"] in ("warning", "error")]
          and report["count_as_p5"])
    lines = ["| reading | seconds | GPUs | warnings+errors | note |", "|---|---|---|---|---|",
             f"| idle | {report['idle']['seconds']} | {len(report['idle']['gpus'])} | "
             f"{sum(f['severity'] != 'info' for f in report['idle']['findings'])} | kernel log: "
             f"{report['idle']['kernel_log'] or '-'}, dcgm: {'yes' if deep else 'not installed'} |",
             f"| busy (matmul on GPU 0) | {report['busy']['seconds']} | {len(report['busy']['gpus'])} | "
             f"{sum(f['severity'] != 'info' for f in report['busy']['findings'])} | loop pid seen on the GPU: "
             f"{report['busy']['loop_pid_seen_on_gpu']}; pcie {[g['pcie'] for g in report['busy']['gpus']]}, "
             f"util {[g['util'] for g in report['busy']['gpus']]} |",
             f"| idle judged as p5.48xlarge, 8 slots | - | - | {len(report['count_as_p5'])} | "
             f"{'; '.join(f['message'] for f in report['count_as_p5'])[:200]} |",
             f"| NCCL one-rank allreduce | - | - | {len(report['nccl']['findings'])} | rc {nccl.returncode}, "
             f"read: {report['nccl']['net_use']} |",
             "", f"verdict: {'PASS' if ok else 'FAIL'}"]
    (out_dir / "gpu-health-proof.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


def data_gpus(text: str) -> list:
    steps = gpu.sections(text)
    try:
        return smi.parse_xml(steps["smi-xml"].text) if "smi-xml" in steps and steps["smi-xml"].rc == 0 else []
    except smi.SmiError:
        return []


if __name__ == "__main__":
    sys.exit(main())
