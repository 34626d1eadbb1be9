"""Writing the copy stream under DEST (stdlib only), hashing every file's bytes as they are written.

Part of the node program ``relay`` (after stream.py, whose names it uses); importable here too.
A file whose written bytes do not hash as the source's sent bytes, or that could not be
written, is a problem named in the hop's status; errors (disk full, read-only) say why.
"""

import errno
import os
import stat

if "Unpacker" not in globals():  # imported (tests, --from local); on a node stream.py comes first
    from clustertool.nodeprogs.stream import new_hash

MAX_BAD = 50


class Tally:
    """What a hop wrote and checked: counts, the files that differ, the errors."""

    def __init__(self):
        self.files = self.verified = self.bytes = 0
        self.bad, self.bad_count, self.errors = [], 0, []

    def problem(self, reason, rel):
        self.bad_count += 1
        if len(self.bad) < MAX_BAD:
            self.bad.append([reason, rel])

    def error(self, rel, exc):
        self.errors.append(f"{rel}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{rel}: {exc}")


class _File:
    __slots__ = ("rec", "fd", "hash", "failed")

    def __init__(self, rec, fd, hasher):
        self.rec, self.fd, self.hash, self.failed = rec, fd, hasher, False


class Extractor:
    """The sink that writes entries under ``root`` and checks each file's hash as it is written."""

    def __init__(self, root, tally):
        self.root, self.algo, self.tally = root, None, tally
        self.root_uid = hasattr(os, "geteuid") and os.geteuid() == 0
        self.dirs, self.made, self.end_rec, self._ids = [], set(), None, {}

    def _path(self, rel):
        return os.path.join(self.root, rel)

    def _parent(self, full):
        parent = os.path.dirname(full)
        if parent not in self.made:
            os.makedirs(parent, exist_ok=True)
            self.made.add(parent)

    def _clear(self, full):
        """Remove what is in the way of a file or link (never a directory's contents)."""
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        os.unlink(full)

    def start(self, rec):
        self.algo = rec["algo"]  # the source's choice: every node checks with the same hash

    def begin_file(self, rec):
        full = self._path(rec["p"])
        try:
            self._parent(full)
            self._clear(full)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
        except OSError as exc:
            self.tally.error(rec["p"], exc)
            handle = _File(rec, None, None)
            handle.failed = True
            return handle
        return _File(rec, fd, new_hash(self.algo))

    def data(self, handle, view):
        if handle.failed:
            return
        if handle.hash is not None:
            handle.hash.update(view)
        try:
            while view:
                view = view[os.write(handle.fd, view):]
        except OSError as exc:
            self.tally.error(handle.rec["p"], exc)
            handle.failed = True
            os.close(handle.fd)
            handle.fd = None

    def end_file(self, handle, trailer):
        rec, self.tally.files = handle.rec, self.tally.files + 1
        if handle.failed:
            self.tally.problem("not written", rec["p"])
            return
        problem = None
        if "e" in trailer:
            problem = f"changed at the source while being sent ({trailer['e']})"
        elif handle.hash is not None and "h" in trailer:
            if handle.hash.hexdigest() == trailer["h"]:
                self.tally.verified += 1
            else:
                problem = "content differs (written bytes do not hash as sent)"
        try:
            self._meta(rec, fd=handle.fd)
            # A bad file gets an mtime no source file has within a second (the quick check compares
            # whole seconds): 1970, or a second later if the source is from 1970. The next copy resends it.
            mtime = rec["m"] if problem is None else (0 if rec["m"] >= 10**9 else 10**9)
            os.utime(handle.fd, ns=(mtime, mtime))
        except OSError as exc:
            self.tally.error(rec["p"], exc)
        finally:
            os.close(handle.fd)
        self.tally.bytes += rec["s"]
        if problem is not None:
            self.tally.problem(problem, rec["p"])

    def entry(self, rec):
        full = self._path(rec["p"])
        try:
            self._parent(full)
            if rec["t"] == "d":
                if not os.path.isdir(full) or os.path.islink(full):
                    self._clear(full)
                    os.mkdir(full, 0o700)
                self.made.add(full)
                self.dirs.append(rec)  # permissions and times last, as tar does
            else:
                self._clear(full)
                os.symlink(rec["l"], full)
                self._meta(rec, link=True)
                os.utime(full, ns=(rec["m"], rec["m"]), follow_symlinks=False)
        except OSError as exc:
            self.tally.error(rec["p"], exc)
            self.tally.problem("not written", rec["p"])

    def _ids_of(self, rec):
        key = (rec.get("un"), rec.get("gn"), rec.get("u"), rec.get("g"))
        if key not in self._ids:
            import grp
            import pwd
            uid, gid = rec.get("u", -1), rec.get("g", -1)
            try:
                uid = pwd.getpwnam(rec["un"]).pw_uid if "un" in rec else uid
            except KeyError:
                pass
            try:
                gid = grp.getgrnam(rec["gn"]).gr_gid if "gn" in rec else gid
            except KeyError:
                pass
            self._ids[key] = (uid, gid)
        return self._ids[key]

    def _meta(self, rec, fd=None, link=False):
        """Owner (as root, by name like tar, else by number) and permission bits."""
        full = self._path(rec["p"])
        if self.root_uid:
            uid, gid = self._ids_of(rec)
            if fd is not None:
                os.fchown(fd, uid, gid)
            else:
                os.chown(full, uid, gid, follow_symlinks=False)
        if link:
            return
        if fd is not None:
            os.fchmod(fd, rec["x"])
        else:
            os.chmod(full, rec["x"])

    def end(self, rec):
        self.end_rec = rec

    def finish(self):
        for rec in sorted(self.dirs, key=lambda r: -r["p"].count("/")):
            try:
                self._meta(rec)
                os.utime(self._path(rec["p"]), ns=(rec["m"], rec["m"]))
            except OSError as exc:
                self.tally.error(rec["p"], exc)
        if self.end_rec is not None and self.end_rec.get("n") != self.tally.files:
            self.tally.errors.append(f"stream held {self.tally.files} files, the source sent {self.end_rec.get('n')}")


class Skipper:
    """The sink of a hop that only relays (it parses, to know the stream ended well)."""

    def start(self, rec):
        pass

    def begin_file(self, rec):
        return None

    def data(self, handle, view):
        pass

    def end_file(self, handle, trailer):
        pass

    def entry(self, rec):
        pass

    def end(self, rec):
        pass

    def finish(self):
        pass
