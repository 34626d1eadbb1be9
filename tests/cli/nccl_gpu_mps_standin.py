"""Stand-in for `nvidia-cuda-mps-control` (CUDA MPS's control program) where no GPU or CUDA exists.

It is NOT MPS: it has the command line the GPU proof uses. `-d` starts a daemon that detaches
(double fork, new session, standard streams on /dev/null, as the real one) and listens on a Unix
socket `control` in $CUDA_MPS_PIPE_DIRECTORY, logging to $CUDA_MPS_LOG_DIRECTORY/control.log; the
`-d` call returns once it listens. Without arguments, each line of stdin is a command sent to the
daemon (`quit` ends it, `get_server_list` answers nothing); no daemon: exit 1, as the real one.
The tests put it on PATH under the real program's name. Knobs:
  STANDIN_MPS_FAIL=1          `-d` fails (exit 1), as where MPS cannot start
  STANDIN_MPS_IGNORE_QUIT=1   the daemon ignores `quit` (the proof must then stop it by its id)
"""

import os
import socket
import sys
import time


def _paths() -> tuple[str, str]:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    return os.path.join(pipe, "control"), os.path.join(logs, "control.log")


def serve(ready_fd: int) -> None:
    path, log = _paths()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(1.0)
    with open(log, "a") as f:
        f.write(f"standin MPS control daemon {os.getpid()} listening on {path}\n")
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    ends = time.monotonic() + 600     # never outlives a broken test for long
    while time.monotonic() < ends:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        with conn:
            try:
                cmd = conn.recv(256).decode().strip()
                if cmd:       # a client that only connects (a CUDA context checking in) gets no answer
                    conn.sendall(b"\n")
            except OSError:
                cmd = ""
        if cmd:
            with open(log, "a") as f:
                f.write(f"command: {cmd}\n")
        if cmd == "quit" and os.environ.get("STANDIN_MPS_IGNORE_QUIT") != "1":
            break
    srv.close()
    os.unlink(path)


def daemonize() -> int:
    if os.environ.get("STANDIN_MPS_FAIL") == "1":
        print("standin MPS: the daemon cannot start here (STANDIN_MPS_FAIL=1)", file=sys.stderr)
        return 1
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        ok = os.read(r, 1) == b"1"
        return 0 if ok else 1
    os.close(r)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        serve(w)
    finally:
        os._exit(0)


def client() -> int:
    path, _ = _paths()
    for line in sys.stdin.read().splitlines():
        try:
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(path)
                c.sendall(line.strip().encode())
                sys.stdout.write(c.recv(256).decode())
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(daemonize() if sys.argv[1:] == ["-d"] else client())
