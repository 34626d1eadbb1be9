"""The program these recordings were taken from: `python sleeper.py sleep|event`, then
`py-spy dump --pid PID --json` (py-spy 0.4.3, CPython 3.11.7, x86_64) once it sleeps."""
import sys
import threading
import time


def stuck_here():
    time.sleep(600)


def waiting(event):
    event.wait(600)


def heartbeat():
    while True:
        time.sleep(1)


def main():
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    if sys.argv[1:] == ["event"]:
        waiting(threading.Event())
    else:
        stuck_here()


if __name__ == "__main__":
    main()
