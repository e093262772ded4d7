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
    "started",
    "exited",
]

_Data = Union[str, bytes, bytearray, memoryview]


def _bytes(data: _Data) -> Union[bytes, bytearray, memoryview]:
    if isinstance(data, str):
        return data.encode("utf-8")
    return data


def InitSocket() -> None:
    """Connects to spproxyd (the default client) if not connected yet."""
    _pysigma.client()


def Started() -> None:
    _pysigma.started()


def Exited(status: int = _pysigma.STATUS_OK, msg: str = "") -> None:
    _pysigma.exited(status, msg)


def ClntID() -> int:
    return _pysigma.clnt_id()


def Stat(pathname: str) -> _pysigma.Stat:
    return _pysigma.stat(pathname)


def Create(pathname: str, perm: int, mode: int) -> int:
    return _pysigma.client().create_fd(pathname, perm, mode)


def Open(pathname: str, mode: int, wait: bool = False) -> int:
    return _pysigma.client().open_fd(pathname, mode, bool(wait))


def Read(fd: int, b: Buffer) -> int:
    """Reads into the writable buffer ``b`` (as much as it holds); returns the count."""
    return _pysigma.client().readinto_fd(fd, b)


def Pread(fd: int, b: Buffer, offset: int) -> int:
    """Reads into ``b`` at ``offset`` without moving the fd's offset; returns the count."""
    return _pysigma.client().readinto_fd(fd, b, offset)


def Write(fd: int, b: _Data) -> int:
    return _pysigma.client().write_fd(fd, _bytes(b))


def Seek(fd: int, offset: int) -> None:
    _pysigma.client().seek_fd(fd, offset)


def CloseFD(fd: int) -> None:
    _pysigma.client().close_fd(fd)


def GetFile(pathname: str) -> bytes:
    return _pysigma.get_file(pathname)


def PutFile(pathname: str, perm: int, mode: int, data: _Data, offset: int = 0,
            leaseID: int = _pysigma.NO_LEASE_ID) -> int:
    return _pysigma.put_file(pathname, _bytes(data), perm, mode, offset, leaseID)


def Remove(pathname: str) -> None:
    _pysigma.remove(pathname)


def Rename(src: str, dst: str) -> None:
    _pysigma.rename(src, dst)


# σPy's earliest examples (pyproc/hello.py) spell these in lower case.
started = Started
exited = Exited
