"""A signal that comes while Python runs code whose exceptions it prints and drops (the hooks os.fork runs, as
logging's lock release after every subprocess start; a finalizer) is not lost: it is raised once that code is
done.  Seen in a full run: a playbook's Ctrl-C came as its step's ssh was forked, "Exception ignored in
_releaseLock" was printed, and the 40 s step ran on to the end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

CHILD = r'''
import sys, time
from clustertool.core import interrupts
interrupts.install()

class Slow:
    def __del__(self):   # a finalizer: an exception raised in it is printed and dropped
        open(sys.argv[1], "w").close()
        t = time.monotonic()
        while time.monotonic() - t < 1.5:
            pass

try:
    Slow()
    time.sleep(30)
    print("ran on")
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(130)
except interrupts.Terminated as exc:
    print("terminated", exc.signum)
    sys.exit(exc.exit_code)
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_inside_a_finalizer_is_raised_after_it(tmp_path, sig):
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ready)], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and child.poll() is None, child.communicate()
        time.sleep(0.01)
    child.send_signal(sig)
    out, err = child.communicate(timeout=30)
    assert "ran on" not in out and "Exception ignored" not in err, out + err
    assert child.returncode == 128 + sig, out + err
