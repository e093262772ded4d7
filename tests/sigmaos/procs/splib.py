"""A σPy program, unchanged but for its import: σPy's `splib` calls (Started, Create, Write,
CloseFD, Open, Read, Exited) through pysigma's splib module. It writes ARG to
name/ux/~local/<OUT>, reads it back, and exits OK only if the bytes match.

usage: e2e-splib.py OUT TEXT
"""
import ctypes
import sys

import pysigma.splib as splib
from pysigma import STATUS_ERR, STATUS_OK

splib.Started()
out, text = sys.argv[1], sys.argv[2]
path = "name/ux/~local/" + out
fd = splib.Create(path, 0o777, 1)  # OWRITE
splib.Write(fd, text)
splib.CloseFD(fd)
fd = splib.Open(path, 0)  # OREAD
buf = ctypes.create_string_buffer(len(text.encode()) + 16)
n = splib.Read(fd, buf)
splib.CloseFD(fd)
if buf.raw[:n] != text.encode():
    splib.Exited(STATUS_ERR, f"read back {buf.raw[:n]!r}")
else:
    splib.Exited(STATUS_OK, "splib")
