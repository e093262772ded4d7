#!/usr/bin/python3 -I
"""A uproc-trampoline that records how procd invoked it, then becomes the upstream trampoline.

It stays in the pid procd started (binfs serves the program only to that pid) and never touches
/mnt/binfs. Install it with

    scripts/sigmaos-e2e --trampoline tests/sigmaos/log-trampoline.py --upstream-gaps --keep-logs

and read <cache>/logs/last/trampoline.log: argv, cwd, identity, capabilities, namespaces (the
proc's beside those of the run's init, pid 1 of procd's procfs), the fds it inherited with their
close-on-exec bit, the environment (long values cut), cgroup, and the mounts around /mnt, /tmp
and /home/sigmaos.
"""

import fcntl
import os
import sys
import time

UPSTREAM = "/home/sigmaos/bin/kernel/uproc-trampoline.upstream"
LOG = "/home/sigmaos/trampoline.log"


def fds():
    out = []
    for n in sorted(int(fd) for fd in os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")
            cloexec = bool(fcntl.fcntl(n, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
        except OSError:
            continue  # the listing's own directory fd, closed again
        if target == "/proc/self/fd" or target.startswith(f"/proc/{os.getpid()}/fd"):
            continue
        out.append(f"  {n} -> {target}{' (cloexec)' if cloexec else ''}")
    return out


def main():
    inherited = fds()
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    lines = [
        f"=== uproc-trampoline invoked at {time.strftime('%T')}",
        f"argv: {sys.argv!r}",
        f"cwd: {os.getcwd()}",
        f"uid/gid: {os.getresuid()} {os.getresgid()} groups {os.getgroups()}",
        f"umask: {oct(os.umask(0o22))}",
    ]
    for k in ("NSpid", "PPid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
        lines.append(f"{k}: {status.get(k)}")
    for ns in ("mnt", "pid", "uts", "net", "ipc", "user", "cgroup", "time"):
        lines.append(f"ns {ns:6} self {os.readlink(f'/proc/self/ns/{ns}')}  init {os.readlink(f'/proc/1/ns/{ns}')}")
    lines.append("fds (inherited):")
    lines += inherited
    ppid = status.get("PPid")
    try:
        parent = sorted(int(n) for n in os.listdir(f"/proc/{ppid}/fd"))
        lines.append(f"parent {ppid} ({open(f'/proc/{ppid}/comm').read().strip()}) fds: {parent}")
    except OSError as e:
        lines.append(f"parent {ppid}: {e}")
    lines.append("env:")
    lines += [f"  {k}={v[:160]}" for k, v in sorted(os.environ.items())]
    with open("/proc/self/cgroup") as f:
        lines.append("cgroup: " + " ".join(f.read().split()))
    try:
        lines.append(f"/tmp/spproxyd: {sorted(os.listdir('/tmp/spproxyd'))}")
        lines.append(f"/home/sigmaos/jail: {sorted(os.listdir('/home/sigmaos/jail'))}")
    except OSError as e:
        lines.append(str(e))
    lines.append("mounts:")
    with open("/proc/self/mountinfo") as f:
        for m in f:
            p = m.split()
            if p[4] in ("/mnt", "/tmp") or p[4].startswith(("/mnt/binfs", "/home/sigmaos")):
                lines.append(f"  {p[4]} {p[-3]} {p[-2]} {p[-1]}")
    with open(LOG, "a") as f:
        f.write("\n".join(lines) + "\n")
    os.execv(UPSTREAM, [UPSTREAM] + sys.argv[1:])


main()
