# Run on the leader (stdlib only, no clustertool import): can it reach every node the way
# mpirun will?  ARGS (prepended by program_text): {"ssh": [addresses], "banner": [addresses],
# "port": 22, "timeout": seconds}.
#
# "ssh" targets get a real `ssh ADDR true` (the node's own ssh config, key and known_hosts, as
# mpirun's ssh); "banner" targets get a TCP connection to their sshd and must answer with an
# SSH banner (the path from the leader to the node is open and sshd is there).  Everything runs
# at once; each target that fails prints one line `fail ADDR reason` (remote/mesh.py reads it).
import socket
import subprocess
import sys
import threading


def banner(addr, port, timeout):
    try:
        with socket.create_connection((addr, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = b""
            while b"\n" not in data and len(data) < 256:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
    except socket.timeout:
        return "no answer from sshd (timed out)"
    except OSError as exc:
        return f"cannot connect to port {port}: {exc.strerror or exc}"
    if not data.startswith(b"SSH-"):
        return f"port {port} answers, but not with an SSH banner"
    return None


def ssh(addr, timeout):
    argv = ["ssh", "-o", f"ConnectTimeout={timeout}", "-o", "BatchMode=yes", addr, "true"]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=timeout * 3)
    except subprocess.TimeoutExpired:
        return "ssh timed out"
    if proc.returncode != 0:
        text = " ".join(proc.stderr.decode("utf-8", "replace").split())
        return text[-160:] or f"ssh exited with {proc.returncode}"
    return None


def main():
    port, timeout = int(ARGS.get("port", 22)), int(ARGS.get("timeout", 10))  # noqa: F821 (prepended)
    failures, lock = {}, threading.Lock()

    def check(kind, addr):
        why = ssh(addr, timeout) if kind == "ssh" else banner(addr, port, timeout)
        if why is not None:
            with lock:
                failures[addr] = why

    threads = [threading.Thread(target=check, args=(kind, addr))
               for kind in ("ssh", "banner") for addr in ARGS.get(kind, [])]  # noqa: F821
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for addr, why in failures.items():
        sys.stdout.write(f"fail {addr} {why}\n")


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__":
    main()
