"""A PyTorch DDP (gloo) training loop that survives losing a node: `clustertool run --restarts N --replace-failed`.

It checkpoints after every step on rank 0's disk, which is the leader's (``~/ckpt-<job>.pt``; or CKPT): a
replaced member comes back with an empty disk and loses nothing, because on a restart rank 0 loads the
checkpoint and DDP hands its parameters to every rank.  On a cluster with a shared filesystem, run it with
--checkpoint-dir on it (CLUSTERTOOL_CHECKPOINT_DIR; or CKPT): a lost leader then takes no checkpoint with
it.  Every rank says the step it resumed at.  On the spot notice's signal (run --on-preempt-signal USR1) a
rank leaves a mark in MARKS (when set) and trains on: the last step's checkpoint
is written already, and the job is stopped before the machine goes.  STEPS, STEP_S: how many steps, and a
pause in each (a toy model trains in no time).

    clustertool run --restarts 2 --replace-failed --follow -- python examples/ddp_checkpoint.py
"""

import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, STEP_S = int(os.environ.get("STEPS", "10")), float(os.environ.get("STEP_S", "0.5"))
job, count = os.environ["CLUSTERTOOL_JOB"], os.environ["CLUSTERTOOL_RESTART_COUNT"]
folder = os.environ.get("CLUSTERTOOL_CHECKPOINT_DIR")  # run --checkpoint-dir (on a shared filesystem: survives)
ckpt = os.path.expanduser(os.environ.get("CKPT") or (os.path.join(folder, f"ckpt-{job}.pt") if folder else
                                                      f"~/ckpt-{job}.pt"))  # rank 0 writes it (default: the leader)


def preempted(signum, _frame):  # the spot notice's signal: the last step's checkpoint is written already
    if os.environ.get("MARKS"):  # (a script with a costlier checkpoint would write it now)
        with open(os.path.join(os.environ["MARKS"], f"signal-{job}-{count}-{os.environ['RANK']}"), "w") as fh:
            fh.write(str(signum))


signal.signal(signal.SIGUSR1, preempted)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, 4)
start = torch.zeros(1, dtype=torch.long)
if rank == 0 and os.path.exists(ckpt):
    saved = torch.load(ckpt)
    model.load_state_dict(saved["model"])
    start[0] = saved["step"]
dist.broadcast(start, 0)
ddp = DDP(model)  # rank 0's parameters (the checkpoint's) go to every rank
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
print(f"rank {rank} attempt {count} resumed at step {int(start)}", flush=True)
for step in range(int(start), STEPS):
    opt.zero_grad()
    ddp(torch.randn(4, 8)).sum().backward()
    opt.step()
    if rank == 0:
        os.makedirs(os.path.dirname(ckpt) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(), "step": step + 1}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(STEP_S)
print(f"rank {rank} done at step {STEPS}", flush=True)
dist.barrier()
dist.destroy_process_group()
