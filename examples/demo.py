"""The README demo: runs under `sigma-supervise` with the σOS profile.

It imports `greet`, which is not installed anywhere on this machine: the supervisor fetches it from
the realm's bucket on first access, verifies it and serves it by fd injection. Then it uses the σOS
API through pysigma (realm files on the embedded realm server) and exits like a σOS proc.
"""

import os
import sys

import pysigma

pysigma.started()

import greet  # noqa: E402  (fetched lazily from the bucket)

print(greet.hello("σOS"))
print(f"  greet came from {greet.__file__}")

path = "name/ux/~local/demo/greeting.txt"
try:
    pysigma.create("name/ux/~local/demo", perm=pysigma.DMDIR | 0o777, mode=pysigma.OREAD).close()
except FileExistsError:
    pass
pysigma.put_file(path, greet.hello("realm").encode())
st = pysigma.stat(path)
print(f"  wrote {st.length} bytes to {path}; read back: {pysigma.get_file(path)[:24]!r}...")

try:
    import socket

    # TCP and UDP reach only the proc's own loopback; a raw packet socket is refused outright.
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    print("  unexpected: a packet socket was allowed", file=sys.stderr)
    sys.exit(1)
except PermissionError:
    print("  socket(AF_PACKET) refused by the σOS filter, as it should be")

print(f"  pid {os.getpid()} done")
pysigma.exited(status=pysigma.STATUS_OK, msg="demo finished")
