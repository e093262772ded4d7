"""Stubs for the compiled module ``pysigma._pysigma`` (checked with ``mypy.stubtest``)."""

from types import TracebackType
from typing import Any, Dict, Optional, Type, Union, final

from typing_extensions import Buffer, Self

_BytesLike = Union[bytes, bytearray, memoryview, Buffer]

__all__ = [
    "Client",
    "DMAPPEND",
    "DMDEVICE",
    "DMDIR",
    "DMEXCL",
    "DMEXEC",
    "DMLINK",
    "DMMOUNT",
    "DMNAMEDPIPE",
    "DMREAD",
    "DMSOCKET",
    "DMSYMLINK",
    "DMTMP",
    "DMWRITE",
    "ECODE_BADATTACH",
    "ECODE_BADCOUNT",
    "ECODE_BADDIR",
    "ECODE_BADFCALL",
    "ECODE_BADOFFSET",
    "ECODE_BOTCH",
    "ECODE_CLOSED",
    "ECODE_CREATENONDIR",
    "ECODE_DUPFID",
    "ECODE_DUPTAG",
    "ECODE_ERROR",
    "ECODE_EXISTS",
    "ECODE_INVAL",
    "ECODE_IO",
    "ECODE_ISDIR",
    "ECODE_NOCREATE",
    "ECODE_NOERROR",
    "ECODE_NOMEM",
    "ECODE_NOREMOVE",
    "ECODE_NOSTAT",
    "ECODE_NOTDIR",
    "ECODE_NOTEMPTY",
    "ECODE_NOTFILE",
    "ECODE_NOTFOUND",
    "ECODE_NOTSUPPORTED",
    "ECODE_NOTSYMLINK",
    "ECODE_NOWRITE",
    "ECODE_NOWSTAT",
    "ECODE_PERM",
    "ECODE_RETRY",
    "ECODE_STALE",
    "ECODE_UNKNOWNFID",
    "ECODE_UNKNOWNMSG",
    "ECODE_UNREACHABLE",
    "ECODE_VERSION",
    "ECODE_WALKNODIR",
    "File",
    "NO_CLNT_ID",
    "NO_FID",
    "NO_LEASE_ID",
    "NO_OFFSET",
    "OAPPEND",
    "OCEXEC",
    "OEXCL",
    "OEXEC",
    "ORCLOSE",
    "ORDWR",
    "OREAD",
    "OTRUNC",
    "OWRITE",
    "QTDIR",
    "QTFILE",
    "QTSYMLINK",
    "Qid",
    "STATUS_ERR",
    "STATUS_EVICTED",
    "STATUS_FATAL",
    "STATUS_OK",
    "SigmaError",
    "SigmaExistsError",
    "SigmaIsADirectoryError",
    "SigmaNotADirectoryError",
    "SigmaNotFoundError",
    "SigmaPermissionError",
    "SigmaUnreachableError",
    "Stat",
    "_LocalServer",
    "_serve_local",
    "client",
    "clnt_id",
    "close_fd",
    "connect",
    "create",
    "create_fd",
    "dir_watch",
    "dir_watch_fd",
    "disconnect",
    "exited",
    "get_dir",
    "get_file",
    "open",
    "open_fd",
    "pread_fd",
    "put_file",
    "read_dir_fd",
    "read_fd",
    "read_watch_fd",
    "readinto_fd",
    "remove",
    "rename",
    "seek_fd",
    "started",
    "stat",
    "wait_evict",
    "write_fd",
]

OREAD: int
OWRITE: int
ORDWR: int
OEXEC: int
OEXCL: int
OTRUNC: int
OCEXEC: int
ORCLOSE: int
OAPPEND: int
DMDIR: int
DMAPPEND: int
DMEXCL: int
DMMOUNT: int
DMTMP: int
DMSYMLINK: int
DMLINK: int
DMDEVICE: int
DMNAMEDPIPE: int
DMSOCKET: int
DMREAD: int
DMWRITE: int
DMEXEC: int
QTDIR: int
QTFILE: int
QTSYMLINK: int
STATUS_OK: int
STATUS_EVICTED: int
STATUS_ERR: int
STATUS_FATAL: int
NO_FID: int
NO_OFFSET: int
NO_LEASE_ID: int
NO_CLNT_ID: int
ECODE_NOERROR: int
ECODE_BADATTACH: int
ECODE_BADOFFSET: int
ECODE_BADCOUNT: int
ECODE_BOTCH: int
ECODE_CREATENONDIR: int
ECODE_DUPFID: int
ECODE_DUPTAG: int
ECODE_ISDIR: int
ECODE_NOCREATE: int
ECODE_NOMEM: int
ECODE_NOREMOVE: int
ECODE_NOSTAT: int
ECODE_NOTFOUND: int
ECODE_NOWRITE: int
ECODE_NOWSTAT: int
ECODE_PERM: int
ECODE_UNKNOWNFID: int
ECODE_BADDIR: int
ECODE_WALKNODIR: int
ECODE_UNREACHABLE: int
ECODE_NOTSUPPORTED: int
ECODE_INVAL: int
ECODE_UNKNOWNMSG: int
ECODE_NOTDIR: int
ECODE_NOTFILE: int
ECODE_NOTSYMLINK: int
ECODE_NOTEMPTY: int
ECODE_VERSION: int
ECODE_STALE: int
ECODE_EXISTS: int
ECODE_CLOSED: int
ECODE_BADFCALL: int
ECODE_IO: int
ECODE_RETRY: int
ECODE_ERROR: int

class SigmaError(OSError):
    """An error reported by σOS."""

    code: int
    name: str
    obj: str
    msg: str

class SigmaNotFoundError(SigmaError, FileNotFoundError): ...
class SigmaPermissionError(SigmaError, PermissionError): ...
class SigmaExistsError(SigmaError, FileExistsError): ...
class SigmaIsADirectoryError(SigmaError, IsADirectoryError): ...
class SigmaNotADirectoryError(SigmaError, NotADirectoryError): ...
class SigmaUnreachableError(SigmaError, ConnectionError): ...

@final
class Qid:
    @property
    def type(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def path(self) -> int: ...
    def __hash__(self) -> int: ...

@final
class Stat:
    @property
    def type(self) -> int: ...
    @property
    def dev(self) -> int: ...
    @property
    def qid(self) -> Qid: ...
    @property
    def mode(self) -> int: ...
    @property
    def atime(self) -> int: ...
    @property
    def mtime(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def gid(self) -> str: ...
    @property
    def muid(self) -> str: ...
    @property
    def is_dir(self) -> bool: ...
    @property
    def is_file(self) -> bool: ...
    @property
    def perm(self) -> int: ...

@final
class File:
    @property
    def fd(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def mode(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def read(self, n: int = -1) -> bytes: ...
    def readinto(self, buf: Buffer) -> int: ...
    def pread(self, n: int, off: int) -> bytes: ...
    def write(self, data: _BytesLike) -> int: ...
    def seek(self, off: int) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

@final
class Client:
    @staticmethod
    def connect_env() -> Client: ...
    @staticmethod
    def connect_socket(path: str) -> Client: ...
    def started(self) -> None: ...
    def exited(self, status: int = 1, msg: str = "") -> None: ...
    def clnt_id(self) -> int: ...
    def stat(self, path: str) -> Stat: ...
    def wait_evict(self) -> None: ...
    def get_dir(self, path: str) -> list[Stat]: ...
    def read_dir_fd(self, fd: int) -> list[Stat]: ...
    def dir_watch_fd(self, fd: int) -> int: ...
    def read_watch_fd(self, fd: int) -> list[tuple[str, bool]]: ...
    def dir_watch(self, path: str) -> tuple[list[str], int]: ...
    def create(self, path: str, perm: int = 0o777, mode: int = 1) -> File: ...
    def open(self, path: str, mode: int = 0, wait: bool = False) -> File: ...
    def get_file(self, path: str) -> bytes: ...
    def put_file(
        self,
        path: str,
        data: _BytesLike,
        perm: int = 0o777,
        mode: int = 17,
        offset: int = 0,
        lease_id: int = 18446744073709551615,
    ) -> int: ...
    def remove(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def create_fd(self, path: str, perm: int = 0o777, mode: int = 1) -> int: ...
    def open_fd(self, path: str, mode: int = 0, wait: bool = False) -> int: ...
    def read_fd(self, fd: int, size: int) -> bytes: ...
    def pread_fd(self, fd: int, size: int, off: int) -> bytes: ...
    def readinto_fd(self, fd: int, buf: Buffer, off: Optional[int] = None) -> int: ...
    def write_fd(self, fd: int, data: _BytesLike) -> int: ...
    def seek_fd(self, fd: int, off: int) -> None: ...
    def close_fd(self, fd: int) -> None: ...

def connect(socket: Optional[str] = None) -> Client: ...
def disconnect() -> None: ...
def client() -> Client: ...
def started() -> None: ...
def exited(status: int = 1, msg: str = "") -> None: ...
def clnt_id() -> int: ...
def stat(path: str) -> Stat: ...
def wait_evict() -> None: ...
def get_dir(path: str) -> list[Stat]: ...
def read_dir_fd(fd: int) -> list[Stat]: ...
def dir_watch_fd(fd: int) -> int: ...
def read_watch_fd(fd: int) -> list[tuple[str, bool]]: ...
def dir_watch(path: str) -> tuple[list[str], int]: ...
def create(path: str, perm: int = 0o777, mode: int = 1) -> File: ...
def open(path: str, mode: int = 0, wait: bool = False) -> File: ...
def get_file(path: str) -> bytes: ...
def put_file(
    path: str,
    data: _BytesLike,
    perm: int = 0o777,
    mode: int = 17,
    offset: int = 0,
    lease_id: int = 18446744073709551615,
) -> int: ...
def remove(path: str) -> None: ...
def rename(src: str, dst: str) -> None: ...
def create_fd(path: str, perm: int = 0o777, mode: int = 1) -> int: ...
def open_fd(path: str, mode: int = 0, wait: bool = False) -> int: ...
def read_fd(fd: int, size: int) -> bytes: ...
def pread_fd(fd: int, size: int, off: int) -> bytes: ...
def readinto_fd(fd: int, buf: Buffer, off: Optional[int] = None) -> int: ...
def write_fd(fd: int, data: _BytesLike) -> int: ...
def seek_fd(fd: int, off: int) -> None: ...
def close_fd(fd: int) -> None: ...
@final
class _LocalServer:
    @property
    def socket(self) -> str: ...
    def proc_state(self) -> Dict[str, Any]: ...
    def evict(self) -> bool: ...
    def shutdown(self) -> None: ...

def _serve_local(socket_path: str, scratch_dir: str, s3_dir: str) -> _LocalServer: ...
