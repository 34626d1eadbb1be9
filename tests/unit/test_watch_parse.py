"""What the node side of `top` reads: /proc, nvidia-smi's loop lines, ranks' output and their steps."""

from __future__ import annotations

import os
import time

import pytest

from clustertool.nodeprogs import watchnode, watchsteps

pytestmark = pytest.mark.unit

PATTERNS = watchsteps.compile_patterns()


def steps_of(line: str) -> dict | None:
    found = watchsteps.match(line, PATTERNS)
    return None if found is None else dict(found[1], pattern=found[0])


@pytest.mark.parametrize("line, pattern, step, time_s, loss", [
    (" iteration      120/   10000 | consumed samples: 15360 | elapsed time per iteration (ms): 523.4 | "
     "learning rate: 1.0E-04 | lm loss: 7.215E+00 |", "megatron", 120, 0.5234, 7.215),
    ("[Rank 0] steps: 40 loss: 2.3412 iter time (s): 0.812 samples/sec: 78.8", "deepspeed", 40, 0.812, 2.3412),
    ("iter 250: loss 3.1234, time 45.67ms, mfu 31.20%", "nanogpt", 250, 0.04567, 3.1234),
    ("step 12 loss 0.0769 time 503.1ms", "step", 12, 0.5031, 0.0769),
    ("Step: 7/100, loss=1.5, step_time=0.25s", "step", 7, 0.25, 1.5),
    ("global_step 3000", "step", 3000, None, None),
    ("Iter #4: 123.4 img/sec per CPU", "synthetic-benchmark", 4, None, None),
])
def test_the_common_loggers_give_a_step_and_its_time(line, pattern, step, time_s, loss):
    got = steps_of(line)
    assert got is not None and got["pattern"] == pattern and got["step"] == step
    assert got["time"] == pytest.approx(time_s) if time_s is not None else got["time"] is None
    assert got["loss"] == pytest.approx(loss) if loss is not None else got["loss"] is None


def test_tqdm_bars_give_the_rate_both_ways():
    fast = steps_of(" 45%|████▌     | 45/100 [00:05<00:06,  8.50it/s, loss=0.3]")
    slow = steps_of("Epoch 0:  12%|█▏        | 12/100 [00:24<02:56,  2.00s/it]")
    assert fast["step"] == 45 and fast["total"] == 100 and fast["rate"] == pytest.approx(8.5)
    assert slow["step"] == 12 and slow["rate"] == pytest.approx(0.5)


def test_a_summary_line_with_a_decimal_is_not_a_step():
    """train_mlp.py's last lines ("step: 182.1 ms (compute ...)") are not step 182."""
    assert steps_of("step: 182.1 ms (compute 150.3 ms, allreduce 31.8 ms)") is None
    assert steps_of("loading checkpoint shards") is None


def test_a_users_regex_comes_first_and_a_line_without_step_counts_one():
    patterns = watchsteps.compile_patterns([r"epoch \d+ batch (?P<step>\d+) took (?P<time>\d+)(?P<unit>ms)",
                                            r"^TICK$"])
    assert watchsteps.match("epoch 2 batch 17 took 250ms", patterns)[1]["time"] == pytest.approx(0.25)
    steps = watchsteps.RankSteps()
    for i in range(3):
        steps.feed("TICK", 100.0 + i, patterns)
    assert steps.summary(103.0)["step"] == 3 and steps.summary(103.0)["rate"] == pytest.approx(1.0)


def test_rank_steps_rate_from_arrival_and_time_from_the_lines():
    steps = watchsteps.RankSteps()
    steps.feed("step 1 time 400ms", None, PATTERNS)  # written before watching began: no arrival time
    for i, t in enumerate((10.0, 10.5, 11.0, 11.5)):
        steps.feed(f"step {i + 2} time {400 + i}ms", t, PATTERNS)
    s = steps.summary(12.0)
    assert s["step"] == 5 and s["rate"] == pytest.approx(2.0)        # 3 steps in 1.5 s
    assert s["step_time"] == pytest.approx(0.402)                    # median of the last 3 reported
    steps.feed("step 0 time 400ms", 20.0, PATTERNS)                  # counted from 0 again: a restart
    assert steps.summary(20.0)["step"] == 0 and steps.live_rate() is None


def test_cpu_memory_and_network_from_proc():
    assert watchnode.cpu_jiffies("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n") == (150, 1000)
    used, total = watchnode.meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
    assert (used, total) == (600 * 1024, 1000 * 1024)
    dev = ("Inter-|   Receive  |  Transmit\n face |bytes packets|bytes\n"
           "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
           "  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n"
           "veth12: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n")
    assert watchnode.net_bytes(dev) == {"eth0": (1000, 2000)}


def test_nvidia_smi_loop_lines_and_clock_event_reasons():
    line = "3, 97, 61234, 81559, 650.12, 700.00, 71, 1980, 0x0000000000000044"
    gpu = watchnode.parse_gpu_line(line)
    assert gpu["index"] == 3 and gpu["util"] == 97 and gpu["mem_total"] == 81559 * 2**20
    assert gpu["reasons"] == ["sw_power_cap", "hw_thermal"]
    assert watchnode.parse_gpu_line("0, [N/A], 0, 81559, [N/A], 700.00, 49, 345, 0x0000000000000001")["util"] is None
    assert watchnode.parse_gpu_line("Failed to initialize NVML: Driver/library version mismatch") is None


def test_gpu_batches_are_told_apart_by_their_index():
    gpus = watchnode.Gpus.__new__(watchnode.Gpus)
    gpus.batch, gpus.latest, gpus.state = [], None, None
    import threading
    gpus.lock = threading.Lock()
    for batch in range(2):
        for i in range(2):
            gpus.take(f"{i}, {10 * batch + i}, 0, 100, 1, 2, 3, 4, 0x1")
    gpus.take("0, 99, 0, 100, 1, 2, 3, 4, 0x1")
    assert [g["util"] for g in gpus.snapshot()] == [10, 11]


def test_rank_files_of_the_latest_attempt(tmp_path):
    out = tmp_path / "out"
    for rel in ("1/rank.0/stdout", "1/rank.1/stdout", "attempt.1/1/rank.1/stdout", "attempt.1/1/rank.1/stderr"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x\n")
    files = watchnode.rank_files(str(out))
    assert sorted(files) == [0, 1]
    assert files[1][0] == str(out / "attempt.1/1/rank.1/stdout")
    assert files[0][0] == str(out / "1/rank.0/stdout")


def test_a_tail_reads_whole_lines_split_at_carriage_returns(tmp_path):
    path = tmp_path / "stderr"
    path.write_bytes(b"old line\n")
    tail = watchnode.Tail(str(path))
    assert tail.lines() == ["old line"]
    with open(path, "ab") as fh:
        fh.write(b" 1/10 [00:01<00:09, 1.00it/s]\r 2/10 [00:02<00:08, 1.00it/s]\r 3/1")
    assert tail.lines() == [" 1/10 [00:01<00:09, 1.00it/s]", " 2/10 [00:02<00:08, 1.00it/s]"]
    os.unlink(path)
    path.write_bytes(b"new file\n")       # made anew (a restart): read from its start
    assert tail.lines() == ["new file"]


def test_a_job_on_a_node_reports_each_rank_and_its_last_output(tmp_path):
    out = tmp_path / "out"
    (out / "1/rank.4").mkdir(parents=True)
    (out / "1/rank.4/stdout").write_text("step 9 time 250ms\n")
    job = watchnode.Job("j1", str(out), PATTERNS)
    got = job.sample(time.monotonic())
    assert got["4"]["step"] == 9 and got["4"]["step_time"] == pytest.approx(0.25)
    assert 0 <= got["4"]["age"] < 60


def test_a_real_h200_recording_parses_idle_and_at_its_power_cap():
    """tests/unit/data/watch-gpu-recorded: nvidia-smi's loop on an H200, idle, busy, and with the older field name."""
    from tests.fakes.smi_loop import DATA

    rec = DATA / "watch-gpu-recorded"

    def gpus(name):
        return [g for g in map(watchnode.parse_gpu_line, (rec / name).read_text().splitlines()) if g]

    idle, busy, old = gpus("smi-loop-idle.out"), gpus("smi-loop-busy.out"), gpus("smi-loop-old-name.out")
    assert len(idle) == 6 and all(g["util"] == 0 and g["reasons"] == ["idle"] for g in idle)
    assert idle[0]["mem_total"] == 143771 * 2**20 and idle[0]["power_limit"] == 700.0
    assert busy[-1]["util"] == 100 and busy[-1]["reasons"] == ["sw_power_cap"] and busy[-1]["power"] > 600
    assert all(g["reasons"] == ["sw_power_cap"] and g["util"] >= 99 for g in old)


def test_lines_read_together_count_as_one_point_of_the_rate():
    """Four steps found in one reading (a 2 s reading of a 0.5 s/step rank) are not four points at one time."""
    steps = watchsteps.RankSteps()
    for reading, t in enumerate((0.0, 2.0, 4.0)):
        for k in range(4):
            steps.feed(f"step {4 * reading + k}", t, PATTERNS)
    assert steps.live_rate() == pytest.approx(2.0)
