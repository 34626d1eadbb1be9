#!/usr/bin/env python3
"""A rank's Python script, run so that a script that ended well ends its process well (stdlib only; never
imports clustertool).

``python rankhost.py SCRIPT ARGS...`` (or ``-m MODULE ARGS...``) runs the script as ``python SCRIPT
ARGS...`` runs it: ``__main__``, ``sys.argv``, ``sys.path[0]`` the script's folder (the current one for
``-m``).  When the script ends well (its last line ran, or ``sys.exit(0)``), the process finishes as the
interpreter would, up to its C++ teardown: non-daemon threads are waited for, ``atexit`` functions run,
Python's and C's output is flushed, and the process exits 0 there.  The teardown it skips is where a
process that used ``torch.distributed`` can die after the script's last line, of a thread of gloo or of the
store still running while C++ destroys it ("terminate called without an active exception", signal 6): a
correct script would then fail once in tens of runs.  Any other end (an exception, ``sys.exit(N)``) goes
the interpreter's usual way, traceback and code unchanged.

The job's rank wrapper (jobs/mpirun.py) and the job agent (jobagent.py) start it where the rank is a
Python script; the file lives in ``~/.clustertool`` on every node, named by its content's hash.
"""

import atexit
import os
import runpy
import sys
import threading


def finish():
    """A normal interpreter exit without its C++ teardown: threads, atexit, flushed output, then exit 0."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # what the interpreter does first at exit: wait for the threads that are not daemons
    else:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    finalize_mpi()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # what C and C++ code printed (NCCL's INFO lines ...)
    except (OSError, AttributeError):
        pass
    os._exit(0)


def finalize_mpi():
    """MPI_Finalize where the script's mpi4py initialised MPI and would finalise it at exit: mpi4py does it from the
    interpreter's own finalisation (a C-level exit function), which os._exit skips, and Open MPI's mpirun then
    fails the job however well each rank ended ("exiting improperly": every mpi4py script, train_mlp.py's too)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or getattr(getattr(sys.modules.get("mpi4py"), "rc", None), "finalize", None) is False:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception as exc:  # an MPI error at its end: said, and the process still ends as the script did
        sys.stderr.write(f"rankhost: MPI_Finalize: {exc}\n")


def _users_frames(tb):
    """A traceback from the script's first frame on: this host's and runpy's frames left out, so an error
    reads as it does under plain python."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return tb


def _excepthook(kind, value, tb):
    tb = _users_frames(tb) or tb
    sys.__excepthook__(kind, value.with_traceback(tb) if isinstance(value, BaseException) else value, tb)


def main(argv):
    if argv[:1] == ["-m"] and len(argv) > 1:
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]  # runpy puts the module's file in argv[0], as python -m does
        sys.path[0] = os.getcwd()
        run = lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        script, args = argv[0], argv[1:]
        if not os.path.isfile(script):  # as python says it
            sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: [Errno 2] No such file "
                             "or directory\n")
            sys.exit(2)
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        run = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
    sys.excepthook = _excepthook
    try:
        run()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finish()


if __name__ == "__main__":
    main(sys.argv[1:])
