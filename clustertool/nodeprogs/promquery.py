"""Ask the Prometheus server on this node (the leader's loopback) one instant query (stdlib only).

``ARGS``: ``port``, ``query``, ``timeout``.  Prints Prometheus's own JSON answer on stdout, or one line on
stderr and exit 2 when it does not answer (3 when it answers with an error: its JSON is still printed).
"""

import json
import sys
import urllib.error
import urllib.parse
import urllib.request


def ask(args):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (int(args["port"]), urllib.parse.urlencode({"query": args["query"]}))
    try:
        with urllib.request.urlopen(url, timeout=float(args.get("timeout", 20))) as resp:
            body = resp.read().decode()
    except urllib.error.HTTPError as exc:  # 400 for a bad expression: its JSON says why
        body = exc.read().decode()
    except OSError as exc:
        sys.stderr.write("no Prometheus answers on 127.0.0.1:%s: %s\n" % (args["port"], getattr(exc, "reason", exc)))
        return 2
    sys.stdout.write(body + "\n")
    try:
        return 0 if json.loads(body).get("status") == "success" else 3
    except ValueError:
        return 3


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals() and "query" in ARGS:  # noqa: F821  (prepended)
    sys.exit(ask(ARGS))  # noqa: F821
