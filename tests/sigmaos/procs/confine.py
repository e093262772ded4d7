"""Tries what a σOS proc must not do and reports each attempt to name/ux/~local/<OUT> as JSON,
`{attempt: outcome}`, then exits OK: the client judges the outcomes, not this program.

An outcome is "refused: <errno name>" or "hidden" (the path does not exist in the proc's
world), or what leaked ("READ n bytes", "LISTED [...]", "LEAKED [fds]", "DONE").

usage: e2e-confine.py OUT
"""
import ctypes
import errno
import json
import os
import sys

import pysigma

pysigma.started()
out = sys.argv[1]
H = "/home/sigmaos"
report = {}


def outcome(e):
    if isinstance(e, FileNotFoundError):
        return "hidden"
    return "refused: " + errno.errorcode.get(e.errno or 0, str(e.errno))


def read(name, path):
    try:
        with open(path, "rb") as f:
            report[name] = f"READ {len(f.read())} bytes"
    except OSError as e:
        report[name] = outcome(e)


def listdir(name, path):
    try:
        report[name] = f"LISTED {sorted(os.listdir(path))[:8]}"
    except OSError as e:
        report[name] = outcome(e)


read("aws-credentials", f"{H}/.aws/credentials")
listdir("binfs", "/mnt/binfs")
read("binfs-sleeper", "/mnt/binfs/sleeper-v1.0")
listdir("jails", f"{H}/jail")
listdir("kernel-bin", f"{H}/bin/kernel")
read("kernel-procd", f"{H}/bin/kernel/procd")
listdir("user-bin", f"{H}/bin/user")
listdir("staging", H)
read("etcd-data", "/tmp/etcd/member/snap/db")
listdir("spproxyd-dir", "/tmp/spproxyd")
# The trampoline's program cache (the sleeper's binary is there by now).
listdir("trampoline-cache", f"{H}/trampoline-cache/programs")

# Descriptors: only stdin, stdout, stderr and the σOS connection (procd's leak, e.g. its
# /dev/fuse, must not reach the proc).
given = {0, 1, 2}
sigma = os.readlink(f"/proc/self/fd/{os.environ['SIGMA_SPPROXY_FD']}")  # pysigma holds copies
extra = []
for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue  # the listing's own descriptor, closed by now
    if fd not in given and target != sigma:
        extra.append(f"{fd}->{target}")
report["fds"] = "none beyond the σOS connection" if not extra else f"LEAKED {extra}"

libc = ctypes.CDLL(None, use_errno=True)


def call(name, f):
    ctypes.set_errno(0)
    r = f()
    report[name] = "DONE" if r == 0 else "refused: " + errno.errorcode.get(ctypes.get_errno(), "?")


PTRACE_ATTACH = 16
call("ptrace-attach-parent", lambda: libc.ptrace(PTRACE_ATTACH, os.getppid(), None, None))
call("mount-tmpfs", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
call("unshare-user", lambda: libc.unshare(0x10000000))  # CLONE_NEWUSER
call("chroot", lambda: libc.chroot(b"/"))
try:
    import socket

    socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("10.0.0.1", 2379))
    report["tcp-etcd"] = "DONE"
except OSError as e:
    report["tcp-etcd"] = outcome(e)

pysigma.put_file("name/ux/~local/" + out, json.dumps(report, sort_keys=True).encode())
pysigma.exited(pysigma.STATUS_OK, "confine")
