"""up's check that the leader reaches every node: who gets a real ssh, who a banner check, and
the node program (nodeprogs/reach.py) run here against real sockets on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from clustertool import nodeprogs
from clustertool.core.model import Node
from clustertool.remote.mesh import LEADER_FULL_MAX, failed_targets, leader_targets

pytestmark = pytest.mark.unit


def nodes(n):
    return [Node(f"node-{i}", i, f"10.0.{i // 250}.{i % 250}") for i in range(1, n + 1)]


def test_small_clusters_get_a_real_ssh_to_every_node():
    by_ssh, by_banner = leader_targets(nodes(LEADER_FULL_MAX))
    assert len(by_ssh) == LEADER_FULL_MAX and by_banner == []


def test_large_clusters_get_a_logarithmic_ssh_sample_and_a_banner_check_of_every_other_node():
    big = nodes(254)
    by_ssh, by_banner = leader_targets(big)
    assert [n.index for n in by_ssh] == [2, 3, 5, 9, 17, 33, 65, 129, 254]  # ring offsets 1, 2, 4 ... and the last
    assert {n.name for n in by_ssh} | {n.name for n in by_banner} == {n.name for n in big}
    assert not {n.name for n in by_ssh} & {n.name for n in by_banner}


def _run_reach(args: dict) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-"], input=nodeprogs.program_text("reach", args), capture_output=True,
                         timeout=60, check=True).stdout.decode()
    return failed_targets(out)


def _server(reply: bytes) -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(reply)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _stop(srv: socket.socket) -> None:
    srv.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread
    srv.close()


def test_reach_passes_an_sshd_banner_and_names_a_closed_port_and_a_stranger():
    sshd, port = _server(b"SSH-2.0-OpenSSH_9.2\r\n")
    try:
        assert _run_reach({"banner": ["127.0.0.1"], "port": port, "timeout": 5}) == {}
    finally:
        _stop(sshd)
    web, web_port = _server(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    try:
        failed = _run_reach({"banner": ["127.0.0.1"], "port": web_port, "timeout": 5})
        assert "not with an SSH banner" in failed["127.0.0.1"]
    finally:
        _stop(web)
    failed = _run_reach({"banner": ["127.0.0.1"], "port": port, "timeout": 5})  # nothing listens there now
    assert failed["127.0.0.1"].startswith(f"cannot connect to port {port}")

