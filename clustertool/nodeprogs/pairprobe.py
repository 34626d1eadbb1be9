"""Node side of `doctor --bisect` (stdlib only): the servers a node's partners measure against,
and the round-trip measurement.

ARGS["mode"]:

* ``serve`` (addr, port, echo_port, pidfile, lifetime): starts ``iperf3 -s`` on addr:port and a TCP
  echo server on addr:echo_port, waits until both listen, then leaves them to a background process
  (pid in pidfile) that ends them on SIGTERM or after ``lifetime`` seconds, whichever comes first,
  so nothing outlives an interrupted doctor for long.  Prints ``ready``, or ``error: ...`` and
  exits 1 (``no-iperf3`` when iperf3 is not installed).
* ``rtt`` (addr, peer, echo_port, count, timeout): ``count`` round trips of a small message to the
  peer's echo server over one TCP connection (Nagle off), after three warm-up trips; prints JSON
  {"rtt_s": median, "min_s": ..., "samples": n}.
* ``stop`` (pidfile): ends the background process of ``serve`` (and with it iperf3).
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

MESSAGE = 64


def listening(port):
    """Whether something listens on TCP ``port`` (any address), from /proc/net/tcp."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def echo(conn):
    with conn:
        try:
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                conn.sendall(data)
        except OSError:
            return


def serve_forever(server, iperf, lifetime):
    def end(*_):
        iperf.terminate()
        try:
            iperf.wait(timeout=5)
        except subprocess.TimeoutExpired:
            iperf.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    timer = threading.Timer(lifetime, end)
    timer.daemon = True
    timer.start()
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            time.sleep(0.05)  # e.g. out of file descriptors for a moment
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def start(args, server):
    """In the background process: iperf3 -s, and its port listening; '' or what went wrong."""
    iperf = subprocess.Popen([shutil.which("iperf3") or "iperf3", "-s", "-B", args["addr"], "-p", str(args["port"])],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not listening(args["port"]):
        if iperf.poll() is not None:
            return None, f"iperf3 -s exited at once on port {args['port']} (the port in use?)"
        if time.monotonic() > deadline:
            iperf.kill()
            return None, f"iperf3 -s did not listen on port {args['port']} within 10 s"
        time.sleep(0.05)
    return iperf, ""


def serve(args):
    if not shutil.which("iperf3"):
        print("error: no-iperf3")
        return 1
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((args["addr"], args["echo_port"]))
    except OSError as exc:
        print(f"error: echo port {args['echo_port']}: {exc.strerror}")
        return 1
    server.listen(64)
    sys.stdout.flush()
    rd, wr = os.pipe()
    if os.fork():  # the parent reports what the background process says, then ends the ssh session
        os.close(wr)
        with os.fdopen(rd) as f:
            said = f.read().strip() or "error: the background process ended"
        print(said)
        return 0 if said == "ready" else 1
    os.close(rd)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # ssh sees the end of the output once the parent is done: none of its pipes here
        os.dup2(devnull, fd)
    iperf, why = start(args, server)
    if iperf is not None:
        with open(args["pidfile"], "w") as f:
            f.write(str(os.getpid()))
    os.write(wr, (why and f"error: {why}" or "ready").encode())
    os.close(wr)
    if iperf is None:
        os._exit(1)
    serve_forever(server, iperf, args["lifetime"])
    return 0


def rtt(args):
    deadline = time.monotonic() + args["timeout"]
    sock = socket.create_connection((args["peer"], args["echo_port"]), timeout=args["timeout"],
                                    source_address=(args["addr"], 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * MESSAGE
    samples = []
    with sock:
        for i in range(args["count"] + 3):
            if time.monotonic() > deadline:
                break
            t0 = time.perf_counter()
            sock.sendall(payload)
            got = 0
            while got < MESSAGE:
                chunk = sock.recv(MESSAGE - got)
                if not chunk:
                    raise OSError("the echo server closed the connection")
                got += len(chunk)
            if i >= 3:
                samples.append(time.perf_counter() - t0)
    if not samples:
        raise OSError(f"no round trip within {args['timeout']}s")
    print(json.dumps({"rtt_s": statistics.median(samples), "min_s": min(samples), "samples": len(samples)}))
    return 0


def stop(args):
    try:
        with open(args["pidfile"]) as f:
            pid = int(f.read().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    try:
        os.unlink(args["pidfile"])
    except OSError:
        pass
    return 0


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)


def main(args):
    try:
        return {"serve": serve, "rtt": rtt, "stop": stop}[args["mode"]](args)
    except OSError as exc:
        print(f"error: {exc.strerror or exc}")
        return 1


if __name__ == "__main__" and "ARGS" in globals():
    sys.exit(main(ARGS))  # noqa: F821
