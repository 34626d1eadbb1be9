"""Stand-in for NVIDIA's dcgm-exporter, for `monitoring enable` on machines with no GPU (and no DCGM).

The real one reads the GPUs through DCGM and serves them in Prometheus's text format at ``/metrics`` on
``--address`` (``:9400`` by default), refreshed every ``--collect-interval`` ms.  The stand-in takes the same two
flags (and refuses any other, so a wrong flag fails the test as it would fail the real one), and serves two GPUs'
worth of DCGM's metric names with fixed values.  Only dcgm-exporter is a stand-in: monitoring.sh's choice of it
over nvidia-smi's textfile collector, the process's mark, Prometheus and its scrape job are the real ones.  Put it
on the node's PATH (``~/.local/bin``, which monitoring.sh looks in first).
"""

from __future__ import annotations

from pathlib import Path

PROGRAM = r'''#!/usr/bin/env python3
# stand-in for NVIDIA's dcgm-exporter (clustertool tests): fixed values under DCGM's metric names
import http.server, socket, sys

address, interval_ms = ":9400", 30000
for arg in sys.argv[1:]:
    key, _, value = arg.partition("=")
    if key in ("--address", "-a") and value:
        address = value
    elif key in ("--collect-interval", "-c") and value.isdigit():
        interval_ms = int(value)
    else:
        sys.exit("stand-in dcgm-exporter: unknown flag %r" % arg)
host, _, port = address.rpartition(":")
GPUS = [("0", "GPU-standin-0000", 97, 61440, 412.5), ("1", "GPU-standin-0001", 95, 60110, 398.0)]
FIELDS = [("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 2), ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used "
          "(in MiB).", 3), ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 4)]


def page():
    lines = []
    for name, help_text, col in FIELDS:
        lines += ["# HELP %s %s" % (name, help_text), "# TYPE %s gauge" % name]
        for gpu in GPUS:
            lines.append('%s{gpu="%s",UUID="%s",device="nvidia%s",modelName="stand-in",Hostname="%s"} %s'
                         % (name, gpu[0], gpu[1], gpu[0], socket.gethostname(), gpu[col]))
    return ("\n".join(lines) + "\n").encode()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = page() if self.path == "/metrics" else b"not found\n"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
'''


def write(folder: Path) -> Path:
    """``folder/dcgm-exporter``, executable."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "dcgm-exporter"
    program.write_text(PROGRAM)
    program.chmod(0o755)
    return program
