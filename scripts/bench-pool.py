#!/usr/bin/env python3
"""Warm procs against cold ones, side by side in one run: every variant of one command is run in
turn, round after round (each round starting one variant later), and the medians compared.

Variants: bare `python3 ...`; `sigma-supervise --no-jail python3 ...` cold (no pool: the
supervisor builds the proc); the same warm (`--warm`: forked by a running `pool --no-jail`'s
zygote); the jailed cold start; and the jailed warm start (forked by a jailed zygote of a
second pool, each proc completing its own σcontainer). Workloads: `python3 -c pass`, and `python3 -c 'import
numpy'` when numpy can be imported (installed, or a wheel unpacked with --numpy-wheel; the pool
then keeps a zygote that preloaded it).

    python3 scripts/bench-pool.py -n 40
    python3 scripts/bench-pool.py -n 40 --numpy-wheel ~/.cache/sigma-ci/wheels/numpy__2.1.3/numpy-*.whl

--throughput: starts per core per second instead, each variant (bare, cold, warm; jailed or not)
running `python3 -c pass` --runs times from --clients concurrent clients (64: the issue's
count), the variants in turn round after round; the medians of the rounds' rates.

    python3 scripts/bench-pool.py --throughput -n 5 --runs 640

--learning: what learning preloads costs and gives a warm run, side by side: bare, warm from a
pool with `--learn-preloads=off` and warm from one that learns (each proc then writes what it
imported at its end, and a set imported by 3 of the last 20 runs gets a zygote), for `-c pass`
and for a program whose imports the learning pool learns in its warm-up.

    python3 scripts/bench-pool.py --learning -n 40 --supervisor $PWD/target/debug/sigma-supervise

--memory N: the unique memory (USS: private clean + dirty, /proc/PID/smaps_rollup) and PSS of
N idle warm procs that imported numpy (`import numpy, time; time.sleep(...)`), all alive at once,
from the jailed pool's numpy zygote, against 5 such bare procs; medians per proc.

    python3 scripts/bench-pool.py --memory 100 --numpy-wheel ~/.cache/sigma-ci/wheels/numpy__2.1.3/numpy-*.whl

The supervisor defaults to the release build scripts/build made last. The pool runs in a
directory of its own (SIGMA_POOL_DIR) and is stopped at the end.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from benchlib import default_supervisor, real_python

PROJECT = tempfile.TemporaryDirectory(prefix="bench-pool.")


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=PROJECT.name,
                       env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench-pool: {' '.join(cmd)} exited {r.returncode}: {r.stderr.decode()[-400:]}")
    return dt


def throughput(variants: dict, rounds: int, runs: int, clients: int) -> None:
    """Each variant's `runs` starts from `clients` concurrent clients, in turn, `rounds` times."""
    from concurrent.futures import ThreadPoolExecutor

    cores = os.cpu_count() or 1
    rates = {k: [] for k in variants}
    names = list(variants)
    with ThreadPoolExecutor(max_workers=clients) as ex:
        for c, e in variants.values():  # warm-up
            list(ex.map(lambda _: timed(c, e), range(clients)))
        for i in range(rounds):
            for k in names[i % len(names):] + names[: i % len(names)]:
                c, e = variants[k]
                t0 = time.perf_counter()
                list(ex.map(lambda _: timed(c, e), range(runs)))
                rates[k].append(runs / (time.perf_counter() - t0) / cores)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n{' '.join(variants['bare'][0])}: {runs} starts from {clients} clients per variant, "
          f"{rounds} rounds, {cores} cores (medians)")
    print(f"{'variant':34} {'starts/core/s':>14} {'÷ bare':>8} {'÷ cold --no-jail':>17}")
    cold = med["sigma-supervise --no-jail (cold)"]
    for k in variants:
        print(f"{k:34} {med[k]:14.1f} {med[k] / med['bare']:8.2f} {med[k] / cold:17.2f}")


def memory(sup: str, py: str, binds: list, env: dict, jailed: dict, n: int) -> None:
    """USS and PSS of `n` idle warm numpy procs alive at once, against 5 bare ones."""
    mark = f"bench-pool-memory-{os.getpid()}"
    code = f"import numpy, time; print('up', flush=True); time.sleep(600)  # {mark}"

    def usage(pid: int) -> tuple:
        fields = {}
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1])
        return fields["Private_Clean"] + fields["Private_Dirty"], fields["Pss"]

    def procs() -> list:
        found = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    cmd = open(f"/proc/{d}/cmdline", "rb").read()
                except OSError:
                    continue
                if mark.encode() in cmd and not cmd.startswith(sup.encode()):
                    found.append(int(d))
        return found

    rows = {}
    for name, cmd, e, count in (
        ("bare", [py, "-c", code], env, 5),
        ("sigma-supervise --warm (jailed)", [sup, "--warm"] + binds + [py, "-c", code], jailed, n),
    ):
        started = [subprocess.Popen(cmd, env=e, cwd=PROJECT.name, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL) for _ in range(count)]
        for p in started:
            if p.stdout.readline() != b"up\n":
                sys.exit(f"bench-pool: a {name} proc did not start")
        time.sleep(1)
        pids = procs()
        sizes = [usage(pid) for pid in pids]
        # A jailed warm proc's pid namespace has an init of its own (made ahead by the zygote):
        # counted with it.
        by_ns = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    by_ns.setdefault(os.readlink(f"/proc/{d}/ns/pid"), []).append(int(d))
                except OSError:
                    pass
        inits = []
        for pid in pids:
            others = [q for q in by_ns.get(os.readlink(f"/proc/{pid}/ns/pid"), []) if q != pid]
            inits.append(sum(usage(q)[0] for q in others) if len(others) == 1 else 0)
        for p in started:
            p.kill()
        for p in started:
            p.wait()
        time.sleep(1)
        if len(sizes) != count:
            sys.exit(f"bench-pool: {len(sizes)} {name} procs found, {count} started")
        rows[name] = (count, statistics.median(u for u, _ in sizes) / 1024,
                      statistics.median(u + i for (u, _), i in zip(sizes, inits)) / 1024,
                      statistics.median(p for _, p in sizes) / 1024,
                      sum(u for u, _ in sizes) / 1024 + sum(inits) / 1024)
    print(f"\nidle procs that imported numpy (medians per proc; MiB)")
    print(f"{'variant':34} {'procs':>6} {'USS':>8} {'+ init':>8} {'PSS':>8} {'USS, all':>9}")
    for k, (c, u, ui, p, total) in rows.items():
        print(f"{k:34} {c:6d} {u:8.2f} {ui:8.2f} {p:8.2f} {total:9.1f}")


def start_pool(cmd: list[str], env: dict) -> subprocess.Popen:
    pool = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    until = time.time() + 60
    while not os.path.exists(os.path.join(env["SIGMA_POOL_DIR"], "pool.sock")):
        if time.time() > until or pool.poll() is not None:
            sys.exit("bench-pool: the pool did not start")
        time.sleep(0.05)
    return pool


def side_by_side(cmd: list[str], variants: dict, rounds: int, base: str, base_label: str) -> None:
    """Rounds of every variant in rotating order; the medians, ÷ bare and ÷ the `base` variant."""
    times = {k: [] for k in variants}
    names = list(variants)
    for i in range(rounds):
        for k in names[i % len(names):] + names[: i % len(names)]:
            c, e = variants[k]
            times[k].append(timed(c, e))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"\n{' '.join(cmd)}  ({rounds} rounds, medians)")
    width = len(base_label) + 1
    print(f"{'variant':34} {'ms':>8} {'÷ bare':>8} {base_label:>{width}}")
    for k in variants:
        print(f"{k:34} {med[k]:8.2f} {med[k] / med['bare']:8.2f} {med[k] / med[base]:{width}.2f}")


def learning_costs(sup: str, py: str, off: dict, on: dict, rounds: int) -> None:
    imports = "import json, decimal, fractions, statistics, csv, email.message"
    for cmd in ([py, "-c", "pass"], [py, "-c", imports]):
        variants = {
            "bare": (cmd, off),
            "warm, --learn-preloads=off": ([sup, "--no-jail", "--warm"] + cmd, off),
            "warm, learning": ([sup, "--no-jail", "--warm"] + cmd, on),
        }
        for c, e in variants.values():  # warm-up (the learning pool learns `imports` here)
            for _ in range(4):
                timed(c, e)
        time.sleep(2)
        side_by_side(cmd, variants, rounds, "warm, --learn-preloads=off", "÷ learning off")
    print()
    subprocess.run([sup, "pool", "--status"], env=on)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="rounds (default 30)")
    ap.add_argument("--supervisor", default=default_supervisor())
    ap.add_argument("--numpy-wheel", help="unpack this numpy wheel and put it on PYTHONPATH")
    ap.add_argument("--throughput", action="store_true",
                    help="starts per core per second from concurrent clients")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients (--throughput)")
    ap.add_argument("--runs", type=int, default=640, help="starts per variant and round (--throughput)")
    ap.add_argument("--memory", type=int, metavar="N",
                    help="unique memory of N idle warm numpy procs alive at once")
    ap.add_argument("--learning", action="store_true",
                    help="warm runs from a pool that learns preloads against one that does not")
    args = ap.parse_args()
    py = real_python()
    sup = args.supervisor
    env = dict(os.environ)
    binds = []
    if args.numpy_wheel:
        site = tempfile.mkdtemp(prefix="bench-pool-site.")
        zipfile.ZipFile(args.numpy_wheel).extractall(site)
        env["PYTHONPATH"] = site
        binds = ["--bind", site]  # the jail shows it
    has_numpy = subprocess.run([py, "-c", "import numpy"], env=env, capture_output=True).returncode == 0
    pool_dir = tempfile.mkdtemp(prefix="bench-pool-sock.")
    env["SIGMA_POOL_DIR"] = pool_dir
    no_pool = dict(env, SIGMA_POOL_DIR=tempfile.mkdtemp(prefix="bench-pool-none."))
    preload = ["--preload", "numpy"] if has_numpy else []
    pool_cmd = [sup, "pool", "--no-jail", "--python", py] + preload
    if args.learning:
        pool_cmd = [sup, "pool", "--no-jail", "--python", py, "--learn-preloads=off"]
    pool = start_pool(pool_cmd, env)
    jailed = dict(env, SIGMA_POOL_DIR=tempfile.mkdtemp(prefix="bench-pool-jailed."))
    jailed_pool = None
    if not args.learning:
        jailed_pool = start_pool([sup, "pool", "--python", py] + binds + preload, jailed)
    if args.learning:
        learning = dict(env, SIGMA_POOL_DIR=tempfile.mkdtemp(prefix="bench-pool-learn."))
        learner = start_pool([sup, "pool", "--no-jail", "--python", py], learning)
        try:
            learning_costs(sup, py, env, learning, args.n)
        finally:
            for e, p in ((env, pool), (learning, learner)):
                subprocess.run([sup, "pool", "--stop"], env=e, stderr=subprocess.DEVNULL)
                p.wait(timeout=10)
        return
    workloads = {"pass": [py, "-c", "pass"]}
    if has_numpy:
        workloads["numpy"] = [py, "-c", "import numpy"]
    else:
        print("numpy cannot be imported: its rows are left out (--numpy-wheel)")
    try:
        if args.memory:
            if not has_numpy:
                sys.exit("bench-pool: --memory needs numpy (--numpy-wheel)")
            memory(sup, py, binds, env, jailed, args.memory)
            return
        if args.throughput:
            cmd = workloads["pass"]
            throughput({
                "bare": (cmd, env),
                "sigma-supervise --no-jail (cold)": ([sup, "--no-jail"] + cmd, no_pool),
                "sigma-supervise --no-jail --warm": ([sup, "--no-jail", "--warm"] + cmd, env),
                "sigma-supervise (jailed, cold)": ([sup] + cmd, no_pool),
                "sigma-supervise --warm (jailed)": ([sup, "--warm"] + cmd, jailed),
            }, args.n, args.runs, args.clients)
            return
        for name, cmd in workloads.items():
            variants = {
                "bare": (cmd, env),
                "sigma-supervise --no-jail (cold)": ([sup, "--no-jail"] + cmd, no_pool),
                "sigma-supervise --no-jail --warm": ([sup, "--no-jail", "--warm"] + cmd, env),
                "sigma-supervise (jailed, cold)": ([sup] + binds + cmd, no_pool),
                "sigma-supervise --warm (jailed)": ([sup, "--warm"] + binds + cmd, jailed),
            }
            for c, e in variants.values():  # warm-up
                timed(c, e)
            side_by_side(cmd, variants, args.n, "sigma-supervise --no-jail (cold)", "÷ cold --no-jail")
    finally:
        for e, p in ((env, pool), (jailed, jailed_pool)):
            if p is not None:
                subprocess.run([sup, "pool", "--stop"], env=e, stderr=subprocess.DEVNULL)
                p.wait(timeout=10)


main()
