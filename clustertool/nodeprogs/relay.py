"""One station of the copy relay (stdlib only), verified in the stream: the source, or a hop.

The node program ``relay`` is stream.py + extract.py + link.py + this file, sent as one
(``program_text``); it runs on nodes, and here for ``copy --from local``.  ``ARGS`` is prepended.

* source: reads the files named in ARGS from disk and sends them as a stream (stream.py),
  hashing every file while it reads it; the hash follows the file's data.  It prints one
  JSON status line on stdout when done.
* hop: reads the stream on stdin, forwards every byte to the next hop at once (the link its
  dialer opened ahead, link.py), and writes the entries under DEST, hashing each file's bytes
  as it writes them; at a file's end it compares its hash with the source's.  When the hops
  after it are done, it says its outcome (a ``CTDONE`` line) on stderr, which flows back up
  the chain to the head like the progress lines, and removes its status folder: no round
  trip is needed to collect it.
"""

import json
import os
import signal
import sys
import time

if "Unpacker" not in globals():  # imported (tests, --from local); on a node the parts come first
    from clustertool.nodeprogs.extract import Extractor, Skipper, Tally
    from clustertool.nodeprogs.link import (
        Forward,
        connect_forward,
        record_pgid,
        remove_dir,
        say,
        spawn_forward,
        widen_pipe,
    )
    from clustertool.nodeprogs.stream import CHUNK, StreamError, Unpacker, pack

PROGRESS_EVERY = 8 << 20
PROGRESS_MARK = "CTPROG"
DONE_MARK = "CTDONE"  # a hop's outcome, one JSON line, up the chain's stderr like progress


# ---- the stations ----------------------------------------------------------------------------

def _forward(args):
    if args.get("dial"):
        return connect_forward(args["sdir"])
    if args.get("forward"):
        proc, w, er = spawn_forward(args["forward"])
        return Forward(w, er, proc=proc)
    return None


class _Gone(Exception):
    pass


def run_source(args):
    src = args["source"]
    if args.get("sdir"):
        record_pgid(args["sdir"], "pgid")
    fwd = _forward(args)

    def send(data):
        fwd.send(data)
        if fwd.fd is None:
            raise _Gone()

    try:
        status = pack(src["root"], src["names"], args.get("algo"), send)
    except _Gone:
        status = {"files": 0, "bytes": 0, "errors": []}
    status["next_rc"] = fwd.wait()
    status["next_error"] = fwd.error
    if args.get("sdir"):
        remove_dir(args["sdir"])
    sys.stdout.write(json.dumps(status) + "\n")
    return 0 if status["next_rc"] == 0 and not fwd.error else 1


def _progress(node, done):
    say(f"{PROGRESS_MARK} {node} {done}\n".encode())


def run_hop(args):
    sdir, tally, err = args["sdir"], Tally(), None
    record_pgid(sdir, "pgid")
    fwd = None
    try:
        fwd = _forward(args)
    except OSError as exc:
        err = f"cannot reach the next hop's dialer: {exc.strerror or exc}"
    sink: Skipper | Extractor = Skipper()  # (a local annotation: never evaluated)
    if args.get("extract"):
        try:
            os.makedirs(args["dest"], exist_ok=True)
            sink = Extractor(args["dest"], tally)
        except OSError as exc:
            err = f"cannot create DEST {args['dest']!r}: {exc.strerror or exc}"
    parser: Unpacker | None = Unpacker(sink)
    marked = 0
    widen_pipe(0)
    buf = bytearray(CHUNK)  # one buffer, read into again and again: no allocation per block
    view = memoryview(buf)
    while True:
        got = os.readv(0, [buf])
        if not got:
            break
        if fwd is not None:
            fwd.send(view[:got])
        if parser is not None:
            try:
                parser.feed(buf, got)
            except StreamError as exc:
                err, parser = str(exc), None
        if parser is not None and parser.payload - marked >= PROGRESS_EVERY:
            marked = parser.payload
            _progress(args["node"], marked)
        if got < CHUNK // 4:
            time.sleep(0.003)  # let the pipe fill: fewer, larger reads (and fewer wake-ups upstream)
    if parser is not None:
        try:
            parser.finish()
        except StreamError as exc:
            err = str(exc)
    sink.finish()
    if parser is not None and args.get("extract"):
        _progress(args["node"], parser.payload)
    next_rc = fwd.wait() if fwd is not None else None  # the hops after this one have reported
    errors = ([err] if err else []) + tally.errors
    status = {"rc": 2 if errors else 0, "err": "; ".join(errors[:3]), "files": tally.files,
              "verified": tally.verified, "bytes": tally.bytes, "bad": tally.bad, "bad_count": tally.bad_count,
              "next_rc": next_rc, "next_error": fwd.error if fwd is not None else None}
    say(f"{DONE_MARK} {args['node']} {json.dumps(status)}\n".encode())
    remove_dir(sdir)
    return status["rc"]


def main(args):
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if "source" in args:
        return run_source(args)
    return run_hop(args)


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "node" in ARGS:  # noqa: F821  (prepended)
    sys.exit(main(ARGS))  # noqa: F821
