#!/usr/bin/env python3
"""What a notified path call costs through the handler, against the raw round trip, in one run.

    scripts/bench-notify.py [--supervisor PATH] [--baseline OLD] [--rounds R] [-n N]

A small Python program makes N raw path calls through ctypes and reports the mean time per call,
measured inside the target (interpreter start-up and its own ~400 notifications are not
counted). Every call names a path outside any served directory, so every decision is
`continue`. Configurations alternate round by round; the tables quote medians over rounds:

- bare: no supervisor (the call's own cost in the kernel);
- raw: `--always-notify` without a path rule, so each call is notified and answered `continue`
  at once without reading anything (the round trip: RECV, wake, SEND);
- handler: `--serve /sigma/bench=DIR`, so each call goes through the path routine (read the path
  from the target, resolve it, decide, re-check) before the same `continue`;
- handler, OLD: the same with another binary (`--baseline`), e.g. the build before a change.

The notification cost of a configuration is its time per call minus bare's; the goal's ratio is
the handler's notification cost over the raw round trip's, from the same round.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import default_supervisor, real_python

PROGRAM = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
call, n = sys.argv[1], int(sys.argv[2])
exe = os.path.realpath(sys.executable)
buf = ctypes.create_string_buffer(256)
AT_FDCWD = -100
if call == "stat-abs":
    path = exe.encode()
elif call == "stat-rel":
    # After a chdir: the cwd is read from /proc once every change of cwd has taken effect,
    # then remembered (its name, on the jail's read-only root, cannot change).
    os.chdir(os.path.dirname(exe))
    path = os.path.basename(exe).encode()
elif call == "stat-dirfd":
    # Relative to a directory fd: named once, then at every call its descriptor is compared
    # with the open file the supervisor holds (one kcmp: a dirfd can be closed and its number
    # reused without a notification).
    dirfd = os.open(os.path.dirname(exe), os.O_RDONLY | os.O_DIRECTORY)
    path = os.path.basename(exe).encode()
elif call == "stat-rel-start":
    # Relative to the cwd the run started in (a directory under /var/tmp): no chdir.
    path = b"f"
elif call == "open-abs":
    path = exe.encode()
else:
    sys.exit(f"unknown call {call}")
SYS_openat, SYS_newfstatat, SYS_close = 257, 262, 3
syscall = libc.syscall
syscall.restype = ctypes.c_long

def stat_loop(k):
    for _ in range(k):
        if syscall(SYS_newfstatat, base, path, buf, 0) != 0:
            sys.exit("newfstatat failed: errno %d" % ctypes.get_errno())

def open_loop(k):
    for _ in range(k):
        fd = syscall(SYS_openat, AT_FDCWD, path, os.O_RDONLY | os.O_CLOEXEC, 0)
        if fd < 0:
            sys.exit("openat failed: errno %d" % ctypes.get_errno())
        syscall(SYS_close, fd)

base = dirfd if call == "stat-dirfd" else AT_FDCWD
loop = open_loop if call == "open-abs" else stat_loop
loop(500)
t0 = time.perf_counter_ns()
loop(n)
print((time.perf_counter_ns() - t0) / n / 1000)
"""

CALLS = ["stat-abs", "stat-rel", "stat-rel-start", "stat-dirfd", "open-abs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--supervisor", default=default_supervisor())
    ap.add_argument("--baseline", help="another sigma-supervise binary, run as `handler, OLD`")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("-n", type=int, default=20000, help="calls per run (default 20000)")
    ap.add_argument("--calls", default=",".join(CALLS),
                    help=f"comma-separated subset of {','.join(CALLS)}")
    ap.add_argument("--extra", default="", help="options added to every supervised run")
    args = ap.parse_args()
    sup = os.path.abspath(args.supervisor)
    if not os.access(sup, os.X_OK):
        sys.exit(f"bench-notify: {sup} not found; run `scripts/build`")
    py = real_python()
    served = tempfile.TemporaryDirectory(prefix="bench-notify-serve-")
    # Every run starts here (the jail shows it as a bind at the same path, on its read-only
    # root): `stat-rel-start`'s file.
    start = tempfile.TemporaryDirectory(prefix="bench-notify-cwd-", dir="/var/tmp")
    Path(start.name, "f").write_text("f\n")
    extra = args.extra.split()
    configs = [
        ("bare", []),
        ("raw", [sup, *extra, "--always-notify", "--"]),
        ("handler", [sup, *extra, "--serve", f"/sigma/bench={served.name}", "--"]),
    ]
    if args.baseline:
        old = os.path.abspath(args.baseline)
        configs.append(("handler, OLD",
                        [old, *extra, "--serve", f"/sigma/bench={served.name}", "--"]))
    calls = args.calls.split(",")
    # results[call][config] = [µs per call, one per round]
    results = {c: {name: [] for name, _ in configs} for c in calls}
    for r in range(args.rounds):
        for call in calls:
            # Rotate the order each round so no side always runs first.
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for name, prefix in order:
                out = subprocess.run([*prefix, py, "-c", PROGRAM, call, str(args.n)],
                                     capture_output=True, text=True, cwd=start.name)
                if out.returncode != 0:
                    sys.exit(f"bench-notify: {name} {call} exited {out.returncode}: {out.stderr}")
                results[call][name].append(float(out.stdout.strip().splitlines()[-1]))
    print(f"{args.rounds} rounds of {args.n} calls; medians in µs per call; "
          f"notification cost = call − bare (median of per-round differences)")
    print()
    print("| call | configuration | µs per call | notification cost | ÷ raw round trip |")
    print("|---|---|---|---|---|")
    for call in calls:
        res = results[call]
        bare = res["bare"]
        raw_cost = [x - b for x, b in zip(res["raw"], bare)]
        for name, _ in configs:
            med = statistics.median(res[name])
            if name == "bare":
                print(f"| {call} | {name} | {med:.2f} | – | – |")
                continue
            cost = [x - b for x, b in zip(res[name], bare)]
            ratio = [c / rc for c, rc in zip(cost, raw_cost) if rc > 0]
            print(f"| {call} | {name} | {med:.2f} | {statistics.median(cost):.2f} | "
                  f"{statistics.median(ratio):.2f} |")


if __name__ == "__main__":
    main()
