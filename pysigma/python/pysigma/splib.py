"""σPy's ``splib`` names and call shapes on top of pysigma, so σPy programs run unchanged.

``import pysigma.splib as splib`` (or install it as ``splib``) and call ``splib.Started()``,
``splib.Create(path, perm, mode)``, ... exactly as with σPy's ctypes library. As there, fds are
plain integers, ``Write``/``PutFile`` take ``str`` (sent as UTF-8) or bytes, and ``Read``/``Pread``
fill a caller-provided buffer (``ctypes.create_string_buffer(n)``, a ``bytearray`` or a writable
``memoryview``) and return the count. Unlike σPy's C library, a failing call raises a
``pysigma.SigmaError`` (or ``ConnectionError``) instead of returning garbage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from . import _pysigma

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "InitSocket",
    "Started",
    "Exited",
    "ClntID",
    "Stat",
    "Create",
    "Open",
    "Read",
    "Pread",
    "Write",
    "Seek",
    "CloseFD",
    "GetFile",
    "PutFile",
    "Remove",
    "Rename",
    "GetDir",
    "DirWatch",
    "WaitEvict",
    "started",
    "exited",
]

_Data = Union[str, bytes, bytearray, memoryview]

# Calls whose names, parameters and defaults already match σPy's are the native functions
# themselves (no Python frame in between); the rest are one-line wrappers around one native call
# each. The σOS calls use the default client, made on first use.

Started = _pysigma.started
Exited = _pysigma.exited  # Exited(status=STATUS_OK, msg="")
ClntID = _pysigma.clnt_id
WaitEvict = _pysigma.wait_evict
Rename = _pysigma.rename  # Rename(src, dst)
CloseFD = _pysigma.close_fd  # CloseFD(fd)


def InitSocket() -> None:
    """Connects to spproxyd (the default client) if not connected yet."""
    _pysigma.client()


def Stat(pathname: str) -> _pysigma.Stat:
    return _pysigma.stat(pathname)


def Create(pathname: str, perm: int, mode: int) -> int:
    return _pysigma.create_fd(pathname, perm, mode)


def Open(pathname: str, mode: int, wait: bool = False) -> int:
    return _pysigma.open_fd(pathname, mode, bool(wait))


def Read(fd: int, b: Buffer) -> int:
    """Reads into the writable buffer ``b`` (as much as it holds); returns the count."""
    return _pysigma.readinto_fd(fd, b)


def Pread(fd: int, b: Buffer, offset: int) -> int:
    """Reads into ``b`` at ``offset`` without moving the fd's offset; returns the count."""
    return _pysigma.readinto_fd(fd, b, offset)


def Write(fd: int, b: _Data) -> int:
    # str is sent as UTF-8 (inline rather than a helper: this is a per-call path).
    return _pysigma.write_fd(fd, b.encode() if isinstance(b, str) else b)


def Seek(fd: int, offset: int) -> None:
    _pysigma.seek_fd(fd, offset)


def GetFile(pathname: str) -> bytes:
    return _pysigma.get_file(pathname)


def PutFile(pathname: str, perm: int, mode: int, data: _Data, offset: int = 0,
            leaseID: int = _pysigma.NO_LEASE_ID) -> int:
    return _pysigma.put_file(pathname, data.encode() if isinstance(data, str) else data, perm,
                             mode, offset, leaseID)


def Remove(pathname: str) -> None:
    _pysigma.remove(pathname)


def GetDir(pathname: str) -> list[_pysigma.Stat]:
    """The entries of directory ``pathname`` (FsLib's ``GetDir``)."""
    return _pysigma.get_dir(pathname)


def DirWatch(fd: int) -> int:
    """σOS's DirWatch on the directory open at ``fd``; read the events with
    ``pysigma.read_watch_fd`` (``(name, created)`` pairs)."""
    return _pysigma.dir_watch_fd(fd)


# σPy's earliest examples (pyproc/hello.py) spell these in lower case.
started = Started
exited = Exited
