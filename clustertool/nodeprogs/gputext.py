"""GPU metrics for Prometheus's node exporter (stdlib only): its textfile collector reads them.

Started by ``monitoring enable`` on every node where nvidia-smi answers.  One ``nvidia-smi --query-gpu
... --loop-ms`` runs for the program's life (watchnode.py's ``Gpus``, the part before this one);
every ``interval`` seconds the latest batch goes to ``DIR/clustertool_gpu.prom`` (written beside it,
then renamed: the exporter never reads half a file).  ``ARGS``: ``dir``, ``interval``.
"""

import os
import time

if "Gpus" not in globals():  # imported (tests); on a node the parts come first
    from clustertool.nodeprogs.watchcore import Exposition
    from clustertool.nodeprogs.watchnode import REASON_BITS, Gpus

GAUGES = (("util", "clustertool_gpu_utilization_percent", "GPU utilisation (nvidia-smi utilization.gpu)"),
          ("mem_used", "clustertool_gpu_memory_used_bytes", "GPU memory in use"),
          ("mem_total", "clustertool_gpu_memory_total_bytes", "GPU memory in all"),
          ("power", "clustertool_gpu_power_watts", "power draw"),
          ("power_limit", "clustertool_gpu_power_limit_watts", "power limit"),
          ("temp", "clustertool_gpu_temperature_celsius", "GPU temperature"),
          ("sm_clock", "clustertool_gpu_sm_clock_mhz", "SM clock"))


def gpu_text(gpus):
    """The node's GPUs in Prometheus's text format (one ``gpu`` label each), or None while none is known."""
    if not isinstance(gpus, list) or not gpus:
        return None
    e = Exposition()
    for g in gpus:
        labels = {"gpu": str(g["index"])}
        for key, name, help_text in GAUGES:
            e.add(name, help_text, g.get(key), labels)
        for _, reason in REASON_BITS:
            if g.get("reasons") is not None:
                e.add("clustertool_gpu_clocks_event_reason", "1 while this reason holds the clocks down",
                      int(reason in g["reasons"]), dict(labels, reason=reason))
    return e.text()


def write(folder, text):
    path = os.path.join(folder, "clustertool_gpu.prom")
    tmp = path + ".%d.tmp" % os.getpid()
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _stop(*_):
    raise KeyboardInterrupt


def main(args):
    interval, folder = float(args.get("interval", 15.0)), os.path.expanduser(args["dir"])
    gpus = Gpus(int(1000 * min(interval, 5.0)))
    try:
        while True:
            time.sleep(interval)
            snapshot = gpus.snapshot()
            if snapshot is None:
                return  # no nvidia-smi here after all
            if isinstance(snapshot, str) and snapshot.startswith("error"):
                write(folder, "# nvidia-smi: %s\n" % snapshot.replace("\n", " "))
                continue
            text = gpu_text(snapshot)
            if text is not None:
                write(folder, text)
    except KeyboardInterrupt:
        pass
    finally:
        gpus.close()


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "dir" in ARGS:  # noqa: F821  (prepended)
    import signal

    signal.signal(signal.SIGTERM, _stop)
    main(ARGS)  # noqa: F821
