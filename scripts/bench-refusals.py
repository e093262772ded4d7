#!/usr/bin/env python3
"""What a refused call and a notified signal cost, side by side in one run.

    scripts/bench-refusals.py [--supervisor PATH] [--rounds R] [-n N]

A small Python program makes N raw calls of one kind through ctypes and reports the mean time
per call, measured inside the target (interpreter start-up is not counted). Configurations
alternate round by round; the table quotes the median over rounds in µs per call and the ratio
to bare:

- `syslog(SIZE_BUFFER)`: outside every profile's list. Bare it runs; under `sigmaos` the kernel
  filter refuses it (EPERM, no notification); with `--audit` each refusal is a notification
  the supervisor answers and logs once.
- `kill(getpid(), 0)`: without a PID namespace kill is notified and decided by descendancy
  (a signal to the caller itself continues).
"""
import argparse
import os
import statistics
import subprocess
import sys

PROGRAM = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
call, n = sys.argv[1], int(sys.argv[2])
if call == "syslog":
    f, args = libc.syscall, (103, 10, None, 0)
else:
    f, args = libc.syscall, (62, os.getpid(), 0)
for _ in range(200):
    f(*args)
t0 = time.perf_counter_ns()
for _ in range(n):
    f(*args)
print((time.perf_counter_ns() - t0) / n / 1000)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--supervisor", default=os.path.join(
        os.path.dirname(__file__), "..", "target", "release", "sigma-supervise"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("-n", type=int, default=20000)
    args = ap.parse_args()
    sup = os.path.abspath(args.supervisor)
    py = sys.executable
    configs = [
        ("syslog", "bare", []),
        ("syslog", "sigmaos (refused in the kernel)", [sup]),
        ("syslog", "sigmaos --audit (refusal notified)", [sup, "--audit"]),
        ("kill", "bare", []),
        ("kill", "sigmaos, no jail (kill notified)", [sup]),
    ]
    results = {i: [] for i in range(len(configs))}
    for _ in range(args.rounds):
        for i, (call, _, prefix) in enumerate(configs):
            out = subprocess.run([*prefix, py, "-c", PROGRAM, call, str(args.n)],
                                 capture_output=True, text=True, check=True)
            results[i].append(float(out.stdout.strip()))
    print(f"| call | configuration | µs per call (median of {args.rounds}) | ratio to bare |")
    print("|---|---|---|---|")
    bare = {}
    for i, (call, label, _) in enumerate(configs):
        med = statistics.median(results[i])
        if label == "bare":
            bare[call] = med
        print(f"| {call} | {label} | {med:.2f} | {med / bare[call]:.2f} |")


if __name__ == "__main__":
    main()
