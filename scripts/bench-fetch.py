#!/usr/bin/env python3
"""Realm library fetch, side by side in one run (alternating, medians, ratios):

  cold       `sigma-supervise --realm --bucket s3://… python3 -c 'import numpy'`, fresh cache
             root each round, from a MinIO on 127.0.0.1 started here
  uv cold    `uv venv` + `uv pip install --no-index --no-deps` of the same local wheels with a
             fresh uv cache + the import from the venv (goal: cold <= 0.5x uv cold)
  uv warm    the same with a warm uv cache (fresh venv each round)
  pip        `pip install --no-index --no-deps --target FRESH` + the import
  bare       the import from a site-packages-like dir with .pyc files (PYTHONPATH=dir)
  new realm  a realm never seen before on a warm cache root (content in the CAS; goal <= 1.2x bare)
  warm       a warm realm: every package installed, lib dir mounted (goal <= 1.05x bare)
  partial    numpy installed, the realm's bucket also lists six, never imported: the lib dir is
             served through notifications (--lazy=never). Run with --no-prefetch: a
             normal run completes a realm this close to complete (six is a few KB), after
             which it is a warm realm
  partial lazy  the same realm served by the lazy backend (ext4 image of placeholders, with
             numpy, installed, shown from the lib dir over them; steady state): a root supervisor's
             default once the realm's image is made, forced here with --lazy (goal <= 1.10x bare)
  partial 2nd  a new realm's second run on the partial side's cache (its first run untimed):
             the run in which a root supervisor's default has the realm's lazy image made
             (`partial 2nd never`: the same with --lazy=never; with --baseline also
             `partial 2nd base`)
  A cold run's download goes on in a fill process after the run has exited: each side's
  time is the run's, its CPU includes the fill processes', and the script waits for them
  before the next side and reports when the install ended too.
  cold paced (with --rate MBPS) the cold side with the bucket's answers paced to MBPS
             megabytes per second by a TCP proxy in front of MinIO, as over a real network
             where the download, not the machine, is the limit (with --baseline also
             `cold paced base`)

    scripts/build
    python3 scripts/bench-fetch.py [-n 7] [--wheel numpy.whl --wheel six.whl]
    python3 scripts/bench-fetch.py -n 5 --wheel W/pandas-*.whl --needed W/numpy-*.whl \
        --needed W/python_dateutil-*.whl --needed W/pytz-*.whl --needed W/tzdata-*.whl \
        --needed W/six-*.whl --import pandas     # a larger set: pandas and its dependencies
    python3 scripts/bench-fetch.py -n 101 --baseline OLD \
        --sides 'bare,warm,warm base,partial lazy,partial lazy base'   # the fast sides only

Wheels default to ${SIGMA_CACHE:-~/.cache/sigma-ci}/wheels/{numpy,six}__*/*.whl (the fetcher
tests download numpy; `pip download --no-deps six -d DIR` for six); MinIO to
${SIGMA_CACHE}/bin/minio (scripts/minio.sh install); uv from PATH (`pip install uv`).
"""
import argparse
import glob
import os
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import default_supervisor, real_python

ROOT = Path(__file__).resolve().parent.parent
USER, PASS = "benchuser", "bench-secret-key"


def ci_cache() -> Path:
    return Path(os.environ.get("SIGMA_CACHE", Path.home() / ".cache" / "sigma-ci"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def paced_proxy(upstream_port: int, mbps: float) -> int:
    """A TCP proxy on 127.0.0.1 to the upstream port that sends the upstream's answers on at
    `mbps` megabytes per second per connection (requests go through unpaced). Bytes are
    forwarded untouched, so signed requests stay valid. Returns its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    rate = mbps * 1e6

    def pump(src, dst, paced):
        start, sent = time.perf_counter(), 0
        try:
            while True:
                data = src.recv(64 << 10)
                if not data:
                    break
                dst.sendall(data)
                if paced:
                    sent += len(data)
                    ahead = sent / rate - (time.perf_counter() - start)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:
            pass
        finally:
            for s_ in (src, dst):
                try:
                    s_.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve():
        while True:
            client, _ = listener.accept()
            up = socket.create_connection(("127.0.0.1", upstream_port))
            for s_ in (client, up):
                s_.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=pump, args=(client, up, False), daemon=True).start()
            threading.Thread(target=pump, args=(up, client, True), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def cpu_used() -> float:
    """User + system seconds of every child reaped so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fill_processes() -> list[int]:
    """Pids of the fill processes running (a jailed cold run's downloads, which go on after
    the run has exited; see supervisor/src/fill.rs), and of the processes making a realm's
    lazy image (started by a default run that found none; see supervisor/src/lazyfs.rs)."""
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if f.read().startswith((b"sigma-supervise-fill\0",
                                            b"sigma-supervise-lazy-prepare\0")):
                        pids.append(int(p))
            except OSError:
                pass
    return pids


def fills_cpu(pids: list[int]) -> float:
    """User + system seconds used so far by these processes (all their threads)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def settle() -> tuple[float, float]:
    """Wait until no fill process runs. Returns (seconds waited, their CPU seconds, read just
    before each one ended: a fill process is reparented away from us, so its CPU is not in
    RUSAGE_CHILDREN)."""
    t0 = time.perf_counter()
    seen: dict[int, float] = {}
    while True:
        pids = fill_processes()
        if not pids:
            waited = time.perf_counter() - t0 if seen else 0.0
            return waited, sum(seen.values())
        for pid in pids:
            c = fills_cpu([pid])
            if c:
                seen[pid] = max(seen.get(pid, 0.0), c)
        time.sleep(0.001)


def run(cmd, env=None, quiet=True) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if quiet else None,
                       stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench-fetch: {shlex.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10, help="alternating pairs per comparison")
    ap.add_argument("--supervisor", default=default_supervisor())
    ap.add_argument("--python", default="python3")
    ap.add_argument("--wheel", action="append", default=None,
                    help="wheel to publish and install (the first is imported; the others are "
                         "listed in the partial realm's bucket and never imported)")
    ap.add_argument("--needed", action="append", default=[],
                    help="a dependency of the first wheel: published and installed with it")
    ap.add_argument("--import", dest="module", default=None,
                    help="what the timed command imports (default: the first wheel's name)")
    ap.add_argument("--uv", default=shutil.which("uv"))
    ap.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for the baseline's sides only (--baseline may then be "
                         "this build, to compare a setting)")
    ap.add_argument("--work-fs", choices=["here", "ext4", "tmpfs"], default="here",
                    help="where every side's files go: a temporary dir (here), a fresh "
                         "16 GB ext4 image with a journal, loop-mounted for this run (root), "
                         "or a tmpfs mounted for this run (root)")
    ap.add_argument("--baseline-publish", action="append", default=[], metavar="ARG",
                    help="an argument of the baseline's publish only (with --baseline this "
                         "build: --baseline-publish=--tar-layout compares the archive layouts)")
    ap.add_argument("--baseline", default=None, metavar="SUPERVISOR",
                    help="another sigma-supervise build: adds its cold, new-realm, warm and "
                         "partial --lazy runs")
    ap.add_argument("--minio", default=str(ci_cache() / "bin" / "minio"))
    ap.add_argument("--rate", type=float, default=None, metavar="MBPS",
                    help="add the cold sides with the bucket paced to MBPS megabytes/s")
    ap.add_argument("--sides", default=None, metavar="NAME,NAME",
                    help="run only these sides (e.g. 'bare,warm,partial lazy'): more rounds of "
                         "the fast ones in the same time")
    args = ap.parse_args()
    py = real_python(args.python)
    sup = args.supervisor
    if not os.access(sup, os.X_OK):
        sys.exit(f"bench-fetch: {sup} missing: scripts/build")
    wheels = args.wheel or [w for w in (
        next(iter(sorted(glob.glob(str(ci_cache() / "wheels" / f"{n}__*" / "*.whl")))), None)
        for n in ("numpy", "six")) if w]
    if not wheels or (args.wheel is None and "numpy" not in Path(wheels[0]).name):
        sys.exit("bench-fetch: no numpy wheel: pass --wheel or run the fetcher tests once")
    wheel = wheels[0]
    needed = [str(Path(w).resolve()) for w in args.needed]
    module = args.module or Path(wheel).name.split("-")[0]
    if not args.uv:
        sys.exit("bench-fetch: uv missing: pip install uv")
    if not os.access(args.minio, os.X_OK):
        sys.exit(f"bench-fetch: {args.minio} missing: scripts/minio.sh install")

    work = Path(tempfile.mkdtemp(prefix="bench-fetch."))
    image = None
    if args.work_fs == "ext4":
        # A fresh ext4 with a journal of its own for every file this run makes: the state of
        # the machine's disk (on ext4 without a journal, new inodes skip those deleted in the
        # last minutes, which slows file creation after earlier runs) stays out of it.
        image = Path(tempfile.mkdtemp(prefix="bench-fetch-img.")) / "work.img"
        subprocess.run(["truncate", "-s", "16G", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(work)], check=True)
    elif args.work_fs == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16G", "bench-fetch", str(work)],
                       check=True)
    print(f"bench-fetch: work dir {work}: " + subprocess.run(
        ["findmnt", "-no", "FSTYPE,OPTIONS", "-T", str(work)], capture_output=True,
        text=True).stdout.strip(), file=sys.stderr)
    port = free_port()
    env = dict(os.environ, MINIO_ROOT_USER=USER, MINIO_ROOT_PASSWORD=PASS)
    minio = subprocess.Popen([args.minio, "server", "--quiet", "--address", f"127.0.0.1:{port}",
                              "--console-address", f"127.0.0.1:{free_port()}", str(work / "data")],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(300):
            r = subprocess.run(["curl", "-fsS", "-o", "/dev/null", f"{endpoint}/minio/health/ready"],
                               capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(0.1)
        else:
            sys.exit("bench-fetch: MinIO not ready")
        # MinIO may answer 503 for a few seconds after it says it is ready (its drive is still
        # being set up): the first bucket is asked for until it is made.
        for _ in range(100):
            r = subprocess.run(["curl", "-fsS", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                                "--user", f"{USER}:{PASS}", f"{endpoint}/libs"],
                               capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(0.1)
        else:
            sys.exit("bench-fetch: MinIO made no bucket: " + r.stderr.decode().strip())
        aws = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=USER,
                   AWS_SECRET_ACCESS_KEY=PASS, AWS_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true")
        aws.pop("PYTHONPATH", None)
        paced = (dict(aws, AWS_ENDPOINT_URL=f"http://127.0.0.1:{paced_proxy(port, args.rate)}")
                 if args.rate else None)
        pydir = str(Path(py).parent)
        aws["PATH"] = pydir + ":" + aws.get("PATH", "")
        extra = wheels[1:]

        def make_bucket(name: str) -> None:
            subprocess.run(["curl", "-fsS", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                            "--user", f"{USER}:{PASS}", f"{endpoint}/{name}"], check=True)

        # Each build reads buckets it published itself (an older build may not read a newer
        # index): the baseline's sides use buckets of their own, named with "-base".
        for binary, suffix in [(sup, ""), *([(args.baseline, "-base")] if args.baseline else [])]:
            if suffix:
                make_bucket(f"libs{suffix}")
            how = args.baseline_publish if suffix else []
            run([binary, "publish", *how, "--bucket", f"s3://libs{suffix}", wheel, *needed],
                env=aws)
            if extra:
                make_bucket(f"libs2{suffix}")
                run([binary, "publish", *how, "--bucket", f"s3://libs2{suffix}", *wheels,
                     *needed], env=aws)
        code = ("import numpy; numpy.arange(3).sum()" if module == "numpy"
                else f"import {module}")
        uv_env = dict(aws, UV_NO_PROGRESS="1", UV_PYTHON_DOWNLOADS="never")

        def base_env(env: dict) -> dict:
            # The baseline's sides run with --baseline-env added (e.g. the same build with
            # SIGMA_SUPERVISE_FILL_PROCESS=always).
            return dict(env, **dict(kv.split("=", 1) for kv in args.baseline_env))

        def supervised(cache: Path, bucket: str = "s3://libs", realm: str = "bench",
                       lazy: bool = False, binary: str = sup, partial: bool = False,
                       default: bool = False) -> list[str]:
            # A partial realm stays partial only if no run completes it (--no-prefetch).
            if binary != sup:
                bucket += "-base"
            # The partial side is the notification path (a root supervisor's default for an
            # incomplete realm is the lazy backend; `default`: no flag).
            lazy_flag = [] if default else ["--lazy"] if lazy else ["--lazy=never"] if partial else []
            return [binary, *lazy_flag,
                    *(["--no-prefetch"] if partial else []), "--realm", realm, "--bucket",
                    bucket, "--cache-dir", str(cache), py, "-c", code]

        def uv_install(venv: Path, cache: Path) -> float:
            t = run([args.uv, "venv", "--quiet", "--python", py, "--cache-dir", str(cache),
                     str(venv)], env=uv_env)
            t += run([args.uv, "pip", "install", "--quiet", "--no-index", "--no-deps",
                      "--python", str(venv / "bin" / "python"), "--cache-dir", str(cache),
                      wheel, *needed], env=uv_env)
            return t + run([str(venv / "bin" / "python"), "-c", code], env=aws)

        # Warm state for the warm sides.
        warm = work / "warm-cache"
        run(supervised(warm), env=aws)
        run(supervised(warm), env=aws)
        warm_base = work / "warm-base-cache"
        if args.baseline:
            run(supervised(warm_base, binary=args.baseline), env=base_env(aws))
            run(supervised(warm_base, binary=args.baseline), env=base_env(aws))
        partial = work / "partial-cache"
        partial_lazy = work / "partial-lazy-cache"
        partial_lazy_base = work / "partial-lazy-base-cache"
        if extra:
            run(supervised(partial, "s3://libs2", partial=True), env=aws)
            run(supervised(partial, "s3://libs2", partial=True), env=aws)
            for _ in range(3):
                run(supervised(partial_lazy, "s3://libs2", lazy=True, partial=True), env=aws)
                if args.baseline:
                    run(supervised(partial_lazy_base, "s3://libs2", lazy=True, partial=True,
                                   binary=args.baseline), env=base_env(aws))
        uv_warm_cache = work / "uv-warm-cache"
        uv_install(work / "uv-warm-venv", uv_warm_cache)
        site = work / "site"
        run([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
             "--disable-pip-version-check", "--target", str(site), wheel, *needed])
        run([py, "-c", code], env=dict(aws, PYTHONPATH=str(site)))

        # One round runs every side once, in a rotating order. Fresh dirs are never deleted
        # until the end: on ext4 without a journal, creating files right after thousands were
        # deleted pays for skipping the recently freed inodes, which would charge one side for
        # another's cleanup.
        times: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        # Side → time until its fill processes had ended too (sides that left any).
        installed: dict[str, list[float]] = {}

        def side(name, fn):
            return name, fn

        for i in range(args.n):
            sides = [
                side("cold", lambda: run(supervised(work / f"cold-cache-{i}"), env=aws)),
                side("uv cold", lambda: uv_install(work / f"uv-cold-venv-{i}",
                                                   work / f"uv-cold-cache-{i}")),
                side("uv warm", lambda: uv_install(work / f"uv-warm-venv-{i}", uv_warm_cache)),
                side("pip", lambda: run([py, "-m", "pip", "install", "--quiet", "--no-index",
                                         "--no-deps", "--disable-pip-version-check", "--target",
                                         str(work / f"pip-target-{i}"), wheel, *needed])
                     + run([py, "-c", code],
                           env=dict(aws, PYTHONPATH=str(work / f"pip-target-{i}")))),
                side("bare", lambda: run([py, "-c", code], env=dict(aws, PYTHONPATH=str(site)))),
                side("new realm", lambda: run(supervised(warm, realm=f"new-{i}"), env=aws)),
                side("warm", lambda: run(supervised(warm), env=aws)),
            ]
            if args.baseline:
                sides.append(side("cold base", lambda: run(
                    supervised(work / f"base-cold-cache-{i}", binary=args.baseline), env=base_env(aws))))
                sides.append(side("new realm base", lambda: run(
                    supervised(warm_base, realm=f"base-new-{i}", binary=args.baseline),
                    env=base_env(aws))))
                sides.append(side("warm base", lambda: run(
                    supervised(warm_base, binary=args.baseline), env=base_env(aws))))
            if extra:
                sides.append(side("partial",
                                  lambda: run(supervised(partial, "s3://libs2", partial=True),
                                              env=aws)))
                sides.append(side("partial lazy",
                                  lambda: run(supervised(partial_lazy, "s3://libs2", lazy=True,
                                                         partial=True), env=aws)))

                def second_run(realm: str, default: bool, base: bool = False) -> float:
                    # A new realm on the partial cache (numpy in the store, six never fetched):
                    # its first run untimed (notification; numpy linked from the store), then
                    # its second, timed: where the default has the realm's lazy image made.
                    if base:
                        cmd = supervised(partial_lazy_base, "s3://libs2", realm=realm,
                                         partial=True, default=default, binary=args.baseline)
                        env = base_env(aws)
                    else:
                        cmd = supervised(partial, "s3://libs2", realm=realm, partial=True,
                                         default=default)
                        env = aws
                    run(cmd, env=env)
                    settle()
                    os.sync()
                    return run(cmd, env=env)

                sides.append(side("partial 2nd", lambda: second_run(f"second-{i}", True)))
                sides.append(side("partial 2nd never",
                                  lambda: second_run(f"second-never-{i}", False)))
                if args.baseline:
                    sides.append(side("partial 2nd base",
                                      lambda: second_run(f"second-base-{i}", True, base=True)))
                    sides.append(side("partial lazy base", lambda: run(
                        supervised(partial_lazy_base, "s3://libs2", lazy=True, partial=True,
                                   binary=args.baseline), env=base_env(aws))))
            if paced:
                sides.append(side("cold paced", lambda: run(
                    supervised(work / f"paced-cache-{i}"), env=paced)))
                if args.baseline:
                    sides.append(side("cold paced base", lambda: run(
                        supervised(work / f"paced-base-cache-{i}", binary=args.baseline),
                        env=base_env(paced))))
            if args.sides:
                wanted = {w.strip() for w in args.sides.split(",")}
                sides = [sd for sd in sides if sd[0] in wanted]
            k = i % len(sides)
            for name, fn in sides[k:] + sides[:k]:
                # Every side starts with nothing dirty: the writeback of the files an earlier
                # side made (72 MB for a numpy install) would otherwise land on whichever side
                # runs next.
                os.sync()
                before = cpu_used()
                took = fn()
                # A cold run may leave its package's rest to a fill process: wait for it
                # (so it never slows the next side) and report when the install ended too.
                tail, tail_cpu = settle()
                times.setdefault(name, []).append(took)
                cpu.setdefault(name, []).append(cpu_used() - before + tail_cpu)
                if tail > 0 or name in installed:
                    installed.setdefault(name, []).append(took + tail)

        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"wheels {', '.join(Path(w).name for w in [wheel, *needed, *wheels[1:]])}; "
              f"`{code}`; {args.n} rounds, "
              f"rotating order; python {py}; {subprocess.run([args.uv, '--version'], capture_output=True, text=True).stdout.strip()}")
        for name, v in times.items():
            print(f"  {name:17} median {med[name] * 1e3:8.1f} ms  "
                  f"(min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f}; "
                  f"cpu {statistics.median(cpu[name]) * 1e3:.1f} ms)")
            if name in installed:
                print(f"  {'':17} until its install ended: median "
                      f"{statistics.median(installed[name]) * 1e3:.1f} ms")
        goals = [("cold", "uv cold", 0.5), ("cold", "uv warm", None), ("cold", "pip", None),
                 ("new realm", "bare", 1.2), ("warm", "bare", 1.05), ("partial", "bare", None),
                 ("partial lazy", "bare", 1.10), ("partial 2nd", "partial 2nd never", None),
                 ("partial 2nd", "bare", None), ("partial 2nd", "partial 2nd base", None), ("cold", "cold base", None),
                 ("new realm", "new realm base", None), ("new realm base", "bare", None),
                 ("warm base", "bare", None), ("partial lazy base", "bare", None),
                 ("partial lazy", "partial lazy base", None),
                 ("cold paced", "cold paced base", None), ("cold paced", "uv cold", None)]
        for a_, b_, goal in goals:
            if a_ in med and b_ in med:
                g = f" (goal <= {goal})" if goal else ""
                print(f"  {a_} / {b_}: {med[a_] / med[b_]:.3f}{g}")
        for cache, bucket, lazy in [(warm, "s3://libs", False), (partial, "s3://libs2", False),
                                    (partial_lazy, "s3://libs2", True)]:
            if bucket == "s3://libs2" and not extra:
                continue
            cmd = supervised(cache, bucket, lazy=lazy, partial=bucket == "s3://libs2")
            stats = subprocess.run(cmd[:1] + ["--stats"] + cmd[1:], env=aws,
                                   capture_output=True, text=True)
            for line in stats.stderr.splitlines():
                if line.startswith("sigma-supervise"):
                    print("  " + line)
    finally:
        minio.terminate()
        minio.wait()
        # Lazy realm images stay mounted for reuse: unmount this run's before removing it.
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mnt = line.split(" ")[4]
                if mnt.startswith(str(work) + "/"):
                    subprocess.run(["umount", mnt], check=False)
        if image or args.work_fs == "tmpfs":
            subprocess.run(["umount", str(work)], check=False)
        if image:
            shutil.rmtree(image.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
