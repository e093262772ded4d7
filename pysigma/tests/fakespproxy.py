"""A scripted spproxy peer on a real Unix socket, for failure paths a real server won't produce.

It speaks the wire framing (``u64 seqno | u32 nframes | frames``) and the RPC envelope
(``Req{method}`` / ``Rep{err}``) by hand, answers Init with success, and hands every later
request to a script that returns the reply frames, or None to close the connection.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import threading
from typing import Callable, List, Optional

Script = Callable[[str, List[bytes]], Optional[List[bytes]]]


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num: int, v: int) -> bytes:
    return varint(num << 3) + varint(v)


def field_bytes(num: int, v: bytes) -> bytes:
    return varint((num << 3) | 2) + varint(len(v)) + v


def rerror(code: int, obj: str = "", msg: str = "") -> bytes:
    out = field_varint(1, code) if code else b""
    if obj:
        out += field_bytes(2, obj.encode())
    if msg:
        out += field_bytes(3, msg.encode())
    return out


OK_REP = field_bytes(1, b"")  # Rep{err: Rerror{}}: `0a 00`


def rpc_error(code: int, obj: str = "", msg: str = "") -> List[bytes]:
    """A 1-frame RPC-level error reply."""
    return [field_bytes(1, rerror(code, obj, msg))]


def app_error(code: int, obj: str = "", msg: str = "", err_field: int = 1) -> List[bytes]:
    """A 2-frame reply whose message carries the error in field `err_field`."""
    return [OK_REP, field_bytes(err_field, rerror(code, obj, msg))]


def _recv_exact(conn: socket.socket, n: int) -> Optional[bytes]:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _parse_method(frame0: bytes) -> str:
    # Req{method=1 string}: 0x0a, varint length, bytes.
    assert frame0[0] == 0x0A, frame0
    i, shift, n = 1, 0, 0
    while True:
        b = frame0[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return frame0[i : i + n].decode()


class FakeSpproxy:
    def __init__(self, script: Script, answer_init: bool = True) -> None:
        self.dir = tempfile.mkdtemp(prefix="fakespproxy-")
        self.path = os.path.join(self.dir, "spproxyd.sock")
        self.script = script
        self.answer_init = answer_init
        self.methods: List[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            while True:
                hdr = _recv_exact(conn, 12)
                if hdr is None:
                    return
                seqno, nframes = struct.unpack("<QI", hdr)
                frames = []
                for _ in range(nframes):
                    raw = _recv_exact(conn, 4)
                    if raw is None:
                        return
                    (ln,) = struct.unpack("<I", raw)
                    body = _recv_exact(conn, ln - 4) if ln > 4 else b""
                    if body is None:
                        return
                    frames.append(body)
                method = _parse_method(frames[0])
                self.methods.append(method)
                if method.endswith(".Init") and self.answer_init:
                    reply: Optional[List[bytes]] = [OK_REP, b""]
                else:
                    reply = self.script(method, frames)
                if reply is None:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                out = bytearray(struct.pack("<QI", seqno, len(reply)))
                for f in reply:
                    out += struct.pack("<I", len(f) + 4) + f
                conn.sendall(bytes(out))

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
            os.rmdir(self.dir)
        except OSError:
            pass

    def __enter__(self) -> "FakeSpproxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
