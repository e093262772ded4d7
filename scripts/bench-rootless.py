#!/usr/bin/env python3
"""An ordinary user's realm, side by side in one run (alternating, medians, ratios to bare):

  bare          nobody's `python3 -c 'import numpy'` with PYTHONPATH at the realm's lib dir
  notify        a partial realm (numpy installed, six listed and never imported) served by
                notification (--lazy=never)
  fuse          the same realm served lazily by its FUSE server (an ordinary user's default once
                the realm has a snapshot; the server already running), numpy shown from the lib
                dir over the mount
  fuse new      the same, the realm's server killed before the run (the run starts another;
                the kill and the dead server's mount removal count)
  warm          a complete realm (its lib dir mounted), of the same user

With --cold N: N alternating rounds of a realm's second run on a fresh cache root (its first run,
untimed, takes the snapshot by listing the prefix), `import numpy` downloading numpy:

  cold notify   served by notification (--lazy=never), the supervisor downloading
  cold fuse     served by the realm's FUSE server, which the run starts and which downloads

Every side runs as nobody (setpriv) with --no-prefetch. Needs root (to become nobody) and
fusermount3 with /dev/fuse 0666 (scripts/bootstrap).

    scripts/build
    python3 scripts/bench-rootless.py -n 60 [--supervisor target/.../sigma-supervise]

Wheels default to ${SIGMA_CACHE:-~/.cache/sigma-ci}/wheels/{numpy,six}__*/*.whl.
"""
import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NOBODY = "setpriv --reuid=65534 --regid=65534 --clear-groups --"


def wheel(name: str) -> str:
    cache = os.environ.get("SIGMA_CACHE", os.path.expanduser("~/.cache/sigma-ci"))
    found = sorted(glob.glob(f"{cache}/wheels/{name}__*/*.whl"))
    if not found:
        sys.exit(f"bench-rootless: no {name} wheel under {cache}/wheels (see the fetcher tests)")
    return found[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=40, help="rounds (default 40)")
    ap.add_argument(
        "--supervisor",
        default=os.path.join(HERE, "..", "target/x86_64-unknown-linux-musl/release/sigma-supervise"),
    )
    ap.add_argument("--python", default="/usr/bin/python3", help="an interpreter nobody can run")
    ap.add_argument("--cold", type=int, default=0, metavar="N", help="also N rounds of the cold sides")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-rootless: run as root (each side runs as nobody through setpriv)")
    work = tempfile.mkdtemp(prefix="sigma-rootless-")
    os.chmod(work, 0o755)
    ss = os.path.join(work, "sigma-supervise")
    shutil.copy(args.supervisor, ss)
    os.chmod(ss, 0o755)
    bucket_dir = os.path.join(work, "bucket")
    os.mkdir(bucket_dir)
    bucket = f"file://{bucket_dir}"
    subprocess.run([ss, "publish", "--bucket", bucket, wheel("numpy"), wheel("six")], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["chmod", "-R", "a+rX", bucket_dir], check=True)
    caches = {}
    for c in ("partial", "complete"):
        caches[c] = os.path.join(work, c)
        os.mkdir(caches[c])
        shutil.chown(caches[c], "nobody", "nogroup")
    py = shlex.quote(args.python)

    def sup(cache: str, realm: str, extra: str = "") -> str:
        return (f"{NOBODY} env HOME=/tmp {ss} --no-prefetch {extra} --realm {realm} "
                f"--bucket {bucket} --cache-dir {cache}")

    part, comp = caches["partial"], caches["complete"]
    sh = lambda c: subprocess.run(c, shell=True, check=True, stdout=subprocess.DEVNULL)
    # The partial realm: numpy installed by notification, six never imported.
    sh(f"{sup(part, 'p', '--lazy=never')} {py} -c 'import numpy'")
    # The complete realm: both imported (the run completes the realm; the next is a mount).
    sh(f"{sup(comp, 'c')} {py} -c 'import numpy, six'")
    settle = f"{sys.executable} -c 'import time; time.sleep(3)'"
    sh(settle)
    kill = f"pkill -KILL -f '^sigma-supervise-fuse {part}'"
    sides = [
        f"bare={NOBODY} env HOME=/tmp PYTHONPATH={part}/realms/p/lib {py} -c 'import numpy'",
        f"notify={sup(part, 'p', '--lazy=never')} {py} -c 'import numpy'",
        f"fuse={sup(part, 'p')} {py} -c 'import numpy'",
        f"fuse new=sh -c {shlex.quote(kill + '; exec ' + sup(part, 'p') + ' ' + py + ' -c ' + shlex.quote('import numpy'))}",
        f"warm={sup(comp, 'c')} {py} -c 'import numpy'",
    ]
    try:
        # Which backend each realm side takes, as --stats says.
        for realm, cache in (("p", part), ("c", comp)):
            out = subprocess.run(f"{sup(cache, realm, '--stats')} {py} -c 'import numpy'", shell=True,
                                 capture_output=True, text=True)
            line = next((l for l in out.stderr.splitlines() if l.startswith("sigma-supervise realm")), "?")
            print(line[:200])
        subprocess.run([sys.executable, os.path.join(HERE, "bench-ab.py"), "-n", str(args.n), *sides],
                       check=True)
        if args.cold:
            cold(args.cold, work, sup, py)
    finally:
        subprocess.run(kill, shell=True)
        subprocess.run(f"grep -o ' {work}[^ ]*' /proc/self/mountinfo | xargs -r -n1 umount -l",
                       shell=True)
        shutil.rmtree(work, ignore_errors=True)


def cold(rounds: int, work: str, sup, py: str) -> None:
    """The cold sides: each round a fresh cache root, its first run untimed."""
    import statistics
    import time
    times = {"cold notify": [], "cold fuse": []}
    for i in range(rounds):
        for side in times:
            cache = os.path.join(work, f"cold-{i}-{side.split()[1]}")
            os.mkdir(cache)
            shutil.chown(cache, "nobody", "nogroup")
            extra = "--lazy=never" if side == "cold notify" else ""
            subprocess.run(f"{sup(cache, 'r', extra)} {py} -c 'import os; os.listdir(\"/sigma/lib\")'",
                           shell=True, check=True, stdout=subprocess.DEVNULL)
            t0 = time.perf_counter()
            subprocess.run(f"{sup(cache, 'r', extra)} {py} -c 'import numpy'", shell=True, check=True)
            times[side].append((time.perf_counter() - t0) * 1e3)
            # The install (the fill process's, or the server's) completes and its writes reach
            # the disk before the next side starts: no side pays for another's writeback.
            marker = os.path.join(cache, "realms/r/state/numpy.installed")
            deadline = time.monotonic() + 60
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            subprocess.run(f"while pgrep -f '^sigma-supervise-fill {cache}' >/dev/null; do sleep 0.05; done",
                           shell=True)
            subprocess.run(f"pkill -KILL -f '^sigma-supervise-fuse {cache}'", shell=True)
            subprocess.run("sync", shell=True)
    for side, t in times.items():
        print(side, " ".join(f"{x:.0f}" for x in t))
    base = statistics.median(times["cold notify"])
    print(f"{rounds} cold rounds, medians")
    for side, t in times.items():
        m = statistics.median(t)
        print(f"{side:<14} {m:9.3f} ms  {m - base:+9.3f}  x {m / base:.3f}")


if __name__ == "__main__":
    main()
