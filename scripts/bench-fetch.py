#!/usr/bin/env python3
"""Realm library fetch, side by side in one run (alternating, medians, ratios):

  (a) cold: `sigma-supervise --realm --bucket s3://… python3 -c 'import numpy'` with a fresh cache
      root each run, from a MinIO on 127.0.0.1 started here
      vs `pip install --no-index --no-deps --target FRESH numpy.whl` + `import numpy` from FRESH
      (target: ratio <= 0.3)
  (b) warm: the same supervised import with a warm cache root (every package of the realm
      installed: the lib dir is mounted, no notifications)
      vs bare `import numpy` from a site-packages-like dir (PYTHONPATH=dir) (target: <= 1.10)
  (c) warm, served by notification: numpy installed, but the realm's bucket also lists a
      package never imported (six), so the lib dir stays served through notifications
      vs the same bare import (no target; reported so the cost of that mode stays visible)

    cargo build --release -p sigma-supervise
    python3 scripts/bench-fetch.py [-n 10] [--wheel numpy.whl]

The wheel defaults to ${SIGMA_CACHE:-~/.cache/sigma-ci}/wheels/numpy__2.1.3/*.whl (the one the
fetcher tests download); MinIO to ${SIGMA_CACHE}/bin/minio (scripts/minio.sh install).
"""
import argparse
import glob
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USER, PASS = "benchuser", "bench-secret-key"


def default_supervisor() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "release" / "sigma-supervise")


def ci_cache() -> Path:
    return Path(os.environ.get("SIGMA_CACHE", Path.home() / ".cache" / "sigma-ci"))


def real_python(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print(sys.executable)"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    ap.add_argument("--wheel", default=None)
    ap.add_argument("--minio", default=str(ci_cache() / "bin" / "minio"))
    args = ap.parse_args()
    py = real_python(args.python)
    sup = args.supervisor
    if not os.access(sup, os.X_OK):
        sys.exit(f"bench-fetch: {sup} missing: cargo build --release -p sigma-supervise")
    wheel = args.wheel or next(iter(sorted(glob.glob(str(ci_cache() / "wheels" / "numpy__*" / "*.whl")))), None)
    if not wheel:
        sys.exit("bench-fetch: no numpy wheel: pass --wheel or run the fetcher tests once")
    if not os.access(args.minio, os.X_OK):
        sys.exit(f"bench-fetch: {args.minio} missing: scripts/minio.sh install")

    work = Path(tempfile.mkdtemp(prefix="bench-fetch."))
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
        subprocess.run(["curl", "-fsS", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                        "--user", f"{USER}:{PASS}", f"{endpoint}/libs"], check=True)
        aws = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=USER,
                   AWS_SECRET_ACCESS_KEY=PASS, AWS_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true")
        aws.pop("PYTHONPATH", None)
        pydir = str(Path(py).parent)
        aws["PATH"] = pydir + ":" + aws.get("PATH", "")
        run([sup, "publish", "--bucket", "s3://libs", wheel], env=aws)
        six = next(iter(sorted(glob.glob(str(ci_cache() / "wheels" / "six__*" / "*.whl")))), None)
        if six:
            subprocess.run(["curl", "-fsS", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                            "--user", f"{USER}:{PASS}", f"{endpoint}/libs2"], check=True)
            run([sup, "publish", "--bucket", "s3://libs2", wheel, six], env=aws)
        code = "import numpy; numpy.arange(3).sum()"

        def supervised(cache: Path, bucket: str = "s3://libs") -> list[str]:
            return [sup, "--realm", "bench", "--bucket", bucket, "--cache-dir", str(cache),
                    py, "-c", code]

        # (a) cold, fresh cache root / fresh target dir each run. Nothing is deleted until the
        # end: on a filesystem without a journal (ext4 nojournal), creating files right after
        # thousands were deleted pays for skipping the recently freed inodes, which would charge
        # one side for the other's cleanup.
        cold_sup, cold_pip = [], []
        for i in range(args.n):
            cache = work / f"cold-cache-{i}"
            cold_sup.append(run(supervised(cache), env=aws))
            tgt = work / f"pip-target-{i}"
            t = run([py, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                     "--disable-pip-version-check", "--target", str(tgt), wheel])
            t += run([py, "-c", code], env=dict(aws, PYTHONPATH=str(tgt)))
            cold_pip.append(t)

        # (b) warm: a warm realm vs bare import from the last pip target (with its .pyc files).
        site = work / f"pip-target-{args.n - 1}"
        warm = work / "warm-cache"
        run(supervised(warm), env=aws)
        run(supervised(warm), env=aws)
        partial = work / "partial-cache"
        if six:
            run(supervised(partial, "s3://libs2"), env=aws)
            run(supervised(partial, "s3://libs2"), env=aws)
        warm_sup, bare, notified = [], [], []
        for _ in range(args.n):
            warm_sup.append(run(supervised(warm), env=aws))
            bare.append(run([py, "-c", code], env=dict(aws, PYTHONPATH=str(site))))
            if six:
                notified.append(run(supervised(partial, "s3://libs2"), env=aws))

        def report(name, a, an, b, bn, target):
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{name}: {an} median {ma * 1e3:.1f} ms | {bn} median {mb * 1e3:.1f} ms | "
                  f"ratio {ma / mb:.3f} (target <= {target})")

        print(f"numpy wheel {Path(wheel).name}, {args.n} alternating pairs each, python {py}")
        report("cold", cold_sup, "supervised fetch+import", cold_pip, "pip install+import", 0.3)
        report("warm", warm_sup, "supervised import", bare, "bare import", 1.10)
        if six:
            report("warm, served by notification", notified, "supervised import", bare,
                   "bare import", "-")
        stats = subprocess.run(supervised(warm)[:1] + ["--stats"] + supervised(warm)[1:],
                               env=aws, capture_output=True, text=True)
        for line in stats.stderr.splitlines():
            if line.startswith("sigma-supervise"):
                print("  " + line)
    finally:
        minio.terminate()
        minio.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
