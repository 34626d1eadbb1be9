"""Standalone program (stdlib only) run on a node by `sync-s3`: fetch S3 objects by presigned URL.

No credentials ever reach the node.  The control machine lists the bucket and presigns one GET
URL per object (short-lived); this program only downloads them.  clustertool starts it with
``nodeprogs.stream_command()`` (its source, ``ARGS`` prepended, arrives on stdin) and then both
sides talk JSON lines, stdin from the control machine and stdout to it:

  control -> node   {"objects": [[rel, size, etag, mtime, check], ...]}   this node's share of the listing
  node -> control   {"need": [i, ...], "bytes": N}                        what is missing or changed here
  control -> node   {"urls": {"i": [url, check], ...}}                    presigned GET URLs (also after "renew")
  node -> control   {"p": bytes}                                          progress, a few times a second
  node -> control   {"renew": [i, ...]}                                   a URL was rejected as expired
  node -> control   {"result": {...}}                                     the last line

``check`` says how an object is verified: 0 = the ETag is the MD5 of the content; N > 0 = a
multipart ETag with parts of N bytes (MD5 of the parts' MD5s); -1 = size only; null = not known
yet (comes with the URL).  ARGS: dest, threads, expiry (seconds), recheck (re-hash files that
look up to date).  Downloads run on ``threads`` threads with keep-alive connections, each into a
partial file beside its target (``.ct-<hash>.part``: resumed by HTTP Range, If-Match the ETag)
hashed while it is written, renamed into place when complete and verified.  What is in place is
recorded (size, ETag, mtime) in ``~/.clustertool/s3-manifests/``, so a re-run fetches nothing.
URLs never touch the disk.
"""

import errno
import http.client
import json
import os
import sys
import threading
import time

try:  # on a node, s3lib.py's source comes first in the same program
    Digest  # noqa: B018
except NameError:  # imported as a module (tests): from the file beside this one
    from clustertool.nodeprogs.s3lib import (
        CHUNK,
        Digest,
        Http,
        Manifest,
        hash_file,
        is_expired,
        partial_name,
        remove,
        s3_error,
        status_of,
        where,
        why,
    )

RETRIES = 4           # per object, for connection errors and 5xx; backoff 0.5, 1, 2, 4 s
FATAL_ERRNO = (errno.ENOSPC, errno.EROFS, errno.EDQUOT)
OUT = threading.Lock()


def send(msg):
    with OUT:
        try:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the control machine went away; read_stdin sees it too and stops the downloads


class ObjectError(Exception):
    """One object failed; the others go on."""


class Fatal(Exception):
    """The node cannot go on (endpoint unreachable, disk full)."""


class Job:
    manifest: "Manifest"  # set once the listing is in (a quoted class annotation: nothing evaluated on a node)

    def __init__(self, args, objects):
        self.dest = os.path.expanduser(args["dest"])
        self.threads = max(1, int(args.get("threads") or 8))
        self.expiry = float(args.get("expiry") or 900)
        self.recheck = bool(args.get("recheck"))
        self.objects = objects
        self.http = Http()
        self.cond = threading.Condition()
        self.urls = {}            # i -> [url, check, generation, received (monotonic)]
        self.generation = -1
        self.renewing = False
        self.stdin_open = True
        self.stop = None          # the fatal reason, once there is one
        self.finished = set()
        self.errors = []
        self.done = 0             # bytes of needed objects now on disk (progress)
        self.counts = {"downloaded": 0, "bytes": 0, "resumed": 0, "verified": 0, "size_only": 0,
                       "renewals": 0, "rechecked": 0, "up_to_date": 0}
        self.queue = []

    def add(self, name, n=1):
        with self.cond:
            self.counts[name] += n

    def progress(self, n):
        with self.cond:
            self.done += n

    # ---- planning ------------------------------------------------------------------------
    def plan(self, manifest):
        need = []
        for i, (rel, size, etag, mtime, check) in enumerate(self.objects):
            if manifest.up_to_date(rel, size, etag, mtime) and not self._differs(rel, etag, check):
                self.counts["up_to_date"] += 1
            else:
                need.append(i)
        return need

    def _differs(self, rel, etag, check):
        """With recheck: whether a file that looks up to date no longer matches its ETag."""
        if not self.recheck or check is None or check < 0 or not self.manifest.hashable(rel):
            return False
        self.counts["rechecked"] += 1
        try:
            return hash_file(os.path.join(self.dest, rel), check) != etag.lower()
        except OSError:
            return True

    # ---- URLs ----------------------------------------------------------------------------
    def take_urls(self, urls):
        with self.cond:
            self.generation += 1
            now = time.monotonic()
            for i, (url, check) in urls.items():
                self.urls[int(i)] = [url, check, self.generation, now]
            self.renewing = False
            self.cond.notify_all()

    def read_stdin(self):
        for line in sys.stdin.buffer:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "urls" in msg:
                self.take_urls(msg["urls"])
        with self.cond:
            self.stdin_open = False
            self.cond.notify_all()
        # stdin closes before this program ends only when the control machine is gone (Ctrl-C, lost
        # connection): stop, keeping partial files for the next run to resume
        self._halt("the control machine went away")

    def renewed(self, i, seen):
        """A fresh URL for object i after its URL (generation ``seen``) was rejected as expired.

        Asks the control machine once per generation for every unfinished object.  None when a URL
        that came from a renewal is rejected while it should still be valid (renewed once, not in
        a loop), or when nobody answers."""
        with self.cond:
            url, check, gen, received = self.urls[i]
            if gen == seen:
                if gen > 0 and time.monotonic() - received < self.expiry / 2:
                    return None
                if not self.renewing:
                    self.renewing = True
                    self.counts["renewals"] += 1
                    send({"renew": [j for j in self.urls if j not in self.finished]})
                while self.urls[i][2] == seen and self.stdin_open and self.stop is None:
                    self.cond.wait(1)
            return self.urls[i] if self.urls[i][2] != seen else None

    # ---- one object ----------------------------------------------------------------------
    def fetch(self, i):
        rel, size, etag, mtime, _ = self.objects[i]
        url, check, gen, _ = self.urls[i]
        path = os.path.join(self.dest, rel)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        part = os.path.join(self.dest, partial_name(rel, etag))
        digest = Digest(check) if check is not None and check >= 0 else None
        have = self._seed(part, size, digest)
        self.add("resumed", have)
        self.progress(have)
        size_only, failures = digest is None, 0
        if size == 0:
            open(part, "wb").close()
        while have < size:
            if self.stop is not None:
                raise ObjectError("stopped")
            headers = {"If-Match": f'"{etag}"'} if etag else {}
            if have:
                headers["Range"] = f"bytes={have}-"
            try:
                resp = self.http.get(url, headers)
            except (OSError, http.client.HTTPException) as exc:
                failures += 1
                if failures > RETRIES:
                    raise Fatal(f"cannot reach {where(url)}: {why(exc)}") from None
                time.sleep(0.5 * 2 ** (failures - 1))
                continue
            status = status_of(resp)
            if status in (200, 206):
                if status == 200 and have:  # the range was not honoured: start over
                    self.progress(-have)
                    self.add("resumed", -have)
                    have, digest = 0, Digest(check) if digest is not None else None
                enc = (resp.headers.get("x-amz-server-side-encryption") or "").lower()
                if enc.startswith("aws:kms") or resp.headers.get("x-amz-server-side-encryption-customer-algorithm"):
                    size_only = True  # such an ETag is not an MD5 of the content
                before = have
                have = self._stream(resp, part, have, digest, url)
                failures = 0 if have > before else failures + 1  # a dropped transfer goes on where it was
                if failures > RETRIES:
                    raise ObjectError(f"the endpoint sent no data ({have} of {size} bytes)")
                continue
            code, message = s3_error(resp)
            self.http.drop(url)  # an error's body may not be all read: no reuse of that connection
            if status == 403 and is_expired(code, message):
                fresh = self.renewed(i, gen)
                if fresh is None:
                    raise ObjectError("presigned URL rejected as expired again right after its renewal "
                                      "(is the control machine's clock right?)")
                url, check, gen, _ = fresh
                continue
            if status in (500, 502, 503, 504) and failures < RETRIES:
                failures += 1
                time.sleep(0.5 * 2 ** (failures - 1))
                continue
            raise ObjectError(self._wording(status, code, message, part))
        return self._finish(i, part, path, have, digest, size_only)

    def _wording(self, status, code, message, part):
        if status == 404:
            return f"gone since the listing (404 {code or 'Not Found'})"
        if status == 412:
            remove(part)
            return "changed since the listing (ETag differs); run sync-s3 again"
        if status == 416:
            remove(part)
            return "partial download longer than the object; removed, run sync-s3 again"
        if status == 403 and code == "InvalidObjectState":
            return "archived (403 InvalidObjectState): restore it from Glacier first"
        if status == 403:
            return f"denied (403 {code}{': ' + message if message else ''})"
        return f"HTTP {status} {code}{': ' + message if message else ''}"

    def _seed(self, part, size, digest):
        try:
            have = os.path.getsize(part)
        except OSError:
            return 0
        if have > size:
            remove(part)
            return 0
        if digest is not None and have:
            with open(part, "rb") as fh:
                for block in iter(lambda: fh.read(CHUNK), b""):
                    digest.update(block)
        return have

    def _stream(self, resp, part, have, digest, url):
        """Append the body to the partial file; returns the bytes now there (a drop keeps them)."""
        with open(part, "ab" if have else "wb") as fh:
            while True:
                if self.stop is not None:
                    self.http.drop(url)
                    raise ObjectError("stopped")
                try:
                    block = resp.read(CHUNK)
                except (OSError, http.client.HTTPException):
                    self.http.drop(url)
                    return have
                if not block:
                    return have
                fh.write(block)
                if digest is not None:
                    digest.update(block)
                have += len(block)
                self.add("bytes", len(block))
                self.progress(len(block))

    def _finish(self, i, part, path, have, digest, size_only):
        rel, size, etag, mtime, _ = self.objects[i]
        if have != size:
            raise ObjectError(f"size {have} != {size}")
        if not size_only:
            got = digest.etag()
            if got != etag.lower():
                remove(part)
                raise ObjectError(f"content differs from the bucket's ETag ({got} != {etag}); removed")
        os.utime(part, (mtime, mtime))
        os.replace(part, path)
        self.manifest.record(rel, size, etag, mtime, "size" if size_only else "etag")
        self.add("downloaded")
        self.add("size_only" if size_only else "verified")

    # ---- the run -------------------------------------------------------------------------
    def worker(self):
        while self.stop is None:
            with self.cond:
                if not self.queue:
                    return
                i = self.queue.pop()
            try:
                self.fetch(i)
            except ObjectError as exc:
                if self.stop is None:
                    self._error(i, str(exc))
            except Fatal as exc:
                self._halt(str(exc))
            except OSError as exc:
                if exc.errno in FATAL_ERRNO:
                    self._halt(f"cannot write under {self.dest}: {why(exc)}")
                else:
                    self._error(i, f"{type(exc).__name__}: {why(exc)}")
            except Exception as exc:  # one object's failure is reported, the rest go on
                self._error(i, f"{type(exc).__name__}: {exc}")
            finally:
                with self.cond:
                    self.finished.add(i)

    def _error(self, i, text):
        with self.cond:
            self.errors.append(f"{self.objects[i][0]}: {text}")

    def _halt(self, reason):
        with self.cond:
            if self.stop is None:
                self.stop = reason
            self.cond.notify_all()

    def reporter(self, running):
        last = None
        while True:
            done = running.wait(0.25)
            if self.done != last:
                last = self.done
                send({"p": last})
            if done:
                return

    def run(self, need):
        with self.cond:
            while self.generation < 0 and self.stdin_open:
                self.cond.wait(1)
        if self.generation < 0:
            raise Fatal("the control machine sent no URLs")
        self.queue = sorted((i for i in need if i in self.urls), key=lambda i: self.objects[i][1])
        finished = threading.Event()
        rep = threading.Thread(target=self.reporter, args=(finished,), daemon=True)
        rep.start()
        workers = [threading.Thread(target=self.worker, daemon=True)
                   for _ in range(min(self.threads, len(self.queue)))]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        finished.set()
        rep.join()


def main(args):
    first = sys.stdin.buffer.readline()
    objects = json.loads(first)["objects"]
    job = Job(args, objects)
    result = {"objects": len(objects), "errors": job.errors, "fatal": None}
    try:
        os.makedirs(job.dest, exist_ok=True)
        if not os.access(job.dest, os.W_OK):
            raise Fatal(f"cannot write to {job.dest}")
        job.manifest = Manifest(job.dest)
        need = job.plan(job.manifest)
        send({"need": need, "bytes": sum(objects[i][1] for i in need)})
        threading.Thread(target=job.read_stdin, daemon=True).start()
        job.run(need)
        result["fatal"] = job.stop
    except Fatal as exc:
        result["fatal"] = str(exc)
    except OSError as exc:
        result["fatal"] = f"{exc.filename or job.dest}: {why(exc)}"
    finally:
        if getattr(job, "manifest", None) is not None:
            try:
                job.manifest.save()
            except OSError:
                pass
    result.update(job.counts)
    send({"result": result})
    return 0 if not result["fatal"] and not result["errors"] else 1


ARGS: dict  # prepended by nodeprogs.program_text; declared for type checkers (an annotation binds nothing)

if __name__ == "__main__" and "ARGS" in globals():
    code = main(ARGS)  # noqa: F821
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: interpreter shutdown waits ~1 s on the stdin reader thread's lock
