"""The clustertool plugin's allreduce for programs that are not NCCL (ctypes, numpy, mpi4py).

The plugin library (``libnccl-net-clustertool.so``) exports a small C entry point next to
NCCL's tables (``native/src/ct_allreduce_api.c``): open a CollNet listener, exchange every
rank's handle, connect, then allreduce host buffers with the plugin's ``servers``,
``sharded`` or ``ring`` algorithm.  Handles are exchanged here with mpi4py's ``allgather``::

    from mpi4py import MPI
    ar = PluginAllreduce(MPI.COMM_WORLD, algo="servers")   # every rank, collectively
    ar.allreduce(grads)                                    # in place, a contiguous numpy array
    ar.close()

The library is found, in order: the ``library`` argument, ``CLUSTERTOOL_PLUGIN_LIB`` (a
path), ``libnccl-net-clustertool.so`` on the loader's path (``clustertool run --plugin``
puts the plugin's folder on ``LD_LIBRARY_PATH``), then this checkout's ``native/build``.
The plugin reads its usual environment: ``CLUSTERTOOL_REDUCERS`` (servers),
``CLUSTERTOOL_SOCKET_ADDR``/``CLUSTERTOOL_SOCKET_IFNAME`` (which address to listen on), etc.

Stdlib and numpy only, so ``train_mlp.py`` can import it as a sibling script on the nodes.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # for the type checker only: on a node this file runs with the stdlib (any python3)
    from typing import Any, Protocol

    import numpy as np

    class Comm(Protocol):
        """What this module uses of an mpi4py communicator (``MPI.COMM_WORLD``)."""

        def Get_rank(self) -> int: ...
        def Get_size(self) -> int: ...
        def allgather(self, sendobj: Any) -> list[Any]: ...

LIBRARY = "libnccl-net-clustertool.so"
ALGORITHMS = ("servers", "sharded", "ring")
# NCCL's enums (ncclDataType_t, ncclRedOp_t), which the entry point takes.
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}


class PluginAllreduceError(RuntimeError):
    """The plugin could not be loaded, connected, or failed an allreduce (one line, with its reason)."""


def library_candidates(explicit: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """Where to look for the plugin library, in order (pure: no file is opened)."""
    env = os.environ if env is None else env
    if explicit:
        return [explicit]
    if env.get("CLUSTERTOOL_PLUGIN_LIB"):
        return [env["CLUSTERTOOL_PLUGIN_LIB"]]
    checkout = Path(__file__).resolve().parents[2] / "native" / "build" / LIBRARY
    return [LIBRARY, str(checkout)]


def load_library(explicit: str | None = None) -> ctypes.CDLL:
    errors = []
    for candidate in library_candidates(explicit):
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as exc:
            errors.append(str(exc))
            continue
        if not hasattr(lib, "ct_allreduce_open"):
            errors.append(f"{candidate}: no ct_allreduce_open (a plugin older than the reduction servers?)")
            continue
        _declare(lib)
        return lib
    raise PluginAllreduceError("cannot load the clustertool plugin: " + "; ".join(errors)
                               + " (build it with `make -C native`, or set CLUSTERTOOL_PLUGIN_LIB)")


def _declare(lib: ctypes.CDLL) -> None:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.ct_allreduce_handle_size.restype = ctypes.c_int
    lib.ct_allreduce_open.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, vp, sz]
    lib.ct_allreduce_open.restype = vp
    lib.ct_allreduce_connect.argtypes = [vp, ctypes.c_char_p, sz]
    lib.ct_allreduce.argtypes = [vp, vp, vp, sz, ctypes.c_int, ctypes.c_int]
    lib.ct_allreduce_algo.argtypes = [vp]
    lib.ct_allreduce_algo.restype = ctypes.c_char_p
    lib.ct_allreduce_servers.argtypes = [vp]
    lib.ct_allreduce_error.argtypes = [vp]
    lib.ct_allreduce_error.restype = ctypes.c_char_p
    lib.ct_allreduce_close.argtypes = [vp]
    lib.ct_allreduce_close.restype = None


class PluginAllreduce:
    """One CollNet communicator of the plugin over the ranks of an mpi4py communicator.

    Collective: every rank constructs it with the same ``algo``.  ``algorithm`` is what the
    plugin really runs: ``servers`` falls back to ``sharded`` (with a WARN on stderr) when no
    reduction server answers; ``strict=True`` turns that into an error instead.
    """

    def __init__(self, comm: Comm, algo: str = "servers", library: str | None = None, strict: bool = False) -> None:
        if algo not in ALGORITHMS:
            raise PluginAllreduceError(f"unknown plugin algorithm {algo!r} (want one of {', '.join(ALGORITHMS)})")
        self._lib = load_library(library)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        hsize = self._lib.ct_allreduce_handle_size()
        handle = ctypes.create_string_buffer(hsize)
        self._h = self._lib.ct_allreduce_open(self.rank, self.size, algo.encode(), handle, hsize)
        opened = bool(self._h)
        if not all(comm.allgather(opened)):
            self.close()
            raise PluginAllreduceError("the plugin could not listen on some rank (see its WARN)")
        every = b"".join(comm.allgather(handle.raw))
        connected = self._lib.ct_allreduce_connect(self._h, every, len(every)) == 0
        why = "" if connected else self._error()
        if not all(comm.allgather(connected)):
            self.close()
            raise PluginAllreduceError(f"the plugin could not connect the ranks: {why or 'failed on another rank'}")
        self.algorithm = self._lib.ct_allreduce_algo(self._h).decode()
        self.servers = int(self._lib.ct_allreduce_servers(self._h))
        if strict and self.size > 1 and self.algorithm != algo:   # one rank has nothing to reduce: no servers
            self.close()
            raise PluginAllreduceError(f"asked for the plugin's {algo} allreduce, it fell back to {self.algorithm}"
                                       " (no reduction server answered? see the plugin's WARN)")

    def _error(self) -> str:
        return self._lib.ct_allreduce_error(self._h).decode(errors="replace")

    def allreduce(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        """Reduce a C-contiguous numpy array across ranks into ``recv`` (default: in place); returns it."""
        recv = send if recv is None else recv
        dtype = DTYPES.get(send.dtype.name)
        if dtype is None or op not in OPS:
            raise PluginAllreduceError(f"unsupported dtype {send.dtype.name} or op {op}")
        if recv.dtype != send.dtype or recv.size != send.size:
            raise PluginAllreduceError("send and recv differ in dtype or size")
        if not (send.flags.c_contiguous and recv.flags.c_contiguous and recv.flags.writeable):
            raise PluginAllreduceError("send and recv must be C-contiguous (recv writeable)")
        if not self._h:
            raise PluginAllreduceError("allreduce on a closed communicator")
        rc = self._lib.ct_allreduce(self._h, send.ctypes.data, recv.ctypes.data, send.size, dtype, OPS[op])
        if rc != 0:
            raise PluginAllreduceError(f"plugin allreduce ({self.algorithm}) failed: {self._error()}")
        return recv

    def close(self) -> None:
        if getattr(self, "_h", None):
            self._lib.ct_allreduce_close(self._h)
        self._h = None

    def __enter__(self) -> PluginAllreduce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
