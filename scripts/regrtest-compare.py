#!/usr/bin/env python3
"""CPython's own regression tests, bare and under sigma-supervise, side by side.

    scripts/regrtest-compare.py [--supervisor PATH] [--python PY] [--timeout S]
        [--ignore PATTERN]... [--with-network] [-- SUP-ARGS...] MODULE...

Each module runs twice with the same interpreter and flags (`PY -m test --junit-xml F
--timeout S MODULE`): bare, then as `sigma-supervise [SUP-ARGS] PY -m test ...` (the default
profile unless SUP-ARGS say otherwise). Per-test results come from the JUnit XML; the table
lists tests run, failures, errors and skips of both runs, the wall time, and the tests whose
outcome differs. A run that exceeds the timeout is a hang (regrtest's faulthandler dumps and
exits). `--ignore PATTERN` is passed to both runs (regrtest's `-i`), for a test that cannot
end once a deliberate refusal broke it. `--with-network` runs the supervised side under a
profile derived from `sigmaos` for the measurement only (written to a temporary file): every
socket family allowed and bind/connect left to the kernel. What differs under `sigmaos` but not
there is the deliberate refusal of the network. A MODULE `mp:fork`, `mp:spawn` or
`mp:forkserver` runs CPython's multiprocessing suite (`test._test_multiprocessing`) for that
start method through regrtest's `--testdir`, for installs that lack the
`test_multiprocessing_*` wrappers. Results go to stdout as a Markdown table (for TRANSPARENCY.md).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET


def mp_testdir(work):
    """A directory of regrtest modules (`test_mp_METHOD`: regrtest reserves the names it splits
    into packages) running CPython's multiprocessing suite
    (`test._test_multiprocessing`) for one start method each, for installs that lack the
    `test_multiprocessing_{fork,forkserver,spawn}` wrappers; importable by spawned children."""
    d = os.path.join(work, "mp-tests")
    os.makedirs(d, exist_ok=True)
    for method in ("fork", "forkserver", "spawn"):
        with open(os.path.join(d, f"test_mp_{method}.py"), "w") as f:
            f.write("import test._test_multiprocessing as suite\n"
                    f"suite.install_tests_in_module_dict(globals(), {method!r})\n")
    return d


def outcomes(xml_path):
    """{test id: 'ok' | 'failure' | 'error' | 'skipped'} from regrtest's JUnit XML."""
    res = {}
    if not os.path.exists(xml_path):
        return res
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}.{case.get('name')}"
        kind = "ok"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = child.tag
                break
        res[tid] = kind
    return res


def run(cmd, timeout):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True, errors="replace")
        code, tail = p.returncode, p.stdout.strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        code, tail = "hang", ["(killed)"]
    return code, time.monotonic() - t0, tail


def counts(res):
    c = {"run": len(res), "failure": 0, "error": 0, "skipped": 0}
    for v in res.values():
        if v != "ok":
            c[v] += 1
    return c


def network_profile():
    """sigmaos with sockets of every family: the socket entries become one unconditional allow,
    bind/connect are allowed instead of notified."""
    import re
    here = os.path.dirname(os.path.abspath(__file__))
    src = open(os.path.join(here, "..", "policies", "profiles", "sigmaos.toml")).read()
    blocks = re.split(r"\n(?=\[\[syscall\]\])", src)
    out = []
    for b in blocks:
        m = re.search(r'^name = "([a-z0-9_]+)"', b, re.M)
        name = m.group(1) if m and b.startswith("[[syscall]]") else None
        if name == "socket":
            continue
        if name in ("bind", "connect"):
            b = b.replace('action = "notify"', 'action = "allow"')
        out.append(b)
    text = "\n".join(out).replace('name = "sigmaos"', 'name = "sigmaos-with-network"', 1)
    text += ('\n[[syscall]]\nname = "socket"\naction = "allow"\norigin = "addition"\n'
             'reason = "measurement only: sockets of every family"\n')
    fd, path = tempfile.mkstemp(suffix=".toml", prefix="sigmaos-with-network-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    import atexit
    atexit.register(os.unlink, path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--supervisor", default=os.path.join(
        os.path.dirname(__file__), "..", "target", "debug", "sigma-supervise"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=int, default=900,
                    help="per-module regrtest timeout in seconds (a hang past it fails)")
    ap.add_argument("--ignore", action="append", default=[],
                    help="regrtest -i PATTERN for both runs (repeatable)")
    ap.add_argument("--with-network", action="store_true",
                    help="supervise under sigmaos with sockets of every family allowed")
    ap.add_argument("modules", nargs="+")
    args, sup_args = ap.parse_known_args()
    sup_args = [a for a in sup_args if a != "--"]
    sup = os.path.abspath(args.supervisor)
    if args.with_network:
        sup_args = ["--profile", network_profile(), *sup_args]
    print(f"| module | bare run/fail/err/skip | supervised run/fail/err/skip | bare s | supervised s | differing tests |")
    print("|---|---|---|---|---|---|")
    total_diff = 0
    for mod in args.modules:
        work = tempfile.mkdtemp(prefix="regrtest-")
        try:
            rows = []
            # The jailed proc sees the work directory (for its JUnit XML) read-write.
            for label, prefix in (("bare", []), ("sup", [sup, "--bind-rw", work, *sup_args])):
                ignores = [a for pat in args.ignore for a in ("-i", pat)]
                xml = os.path.join(work, f"{label}.xml")
                testdir, name = [], mod
                if mod.startswith("mp:"):
                    testdir = ["--testdir", mp_testdir(work)]
                    name = f"test_mp_{mod[3:]}"
                cmd = [*prefix, args.python, "-m", "test", "--junit-xml", xml,
                       "--timeout", str(args.timeout), *testdir, *ignores, name]
                code, secs, tail = run(cmd, args.timeout + 120)
                rows.append((code, secs, outcomes(xml), tail))
            (bc, bs, br, btail), (sc, ss, sr, stail) = rows
            diff = sorted(t for t in set(br) | set(sr) if br.get(t) != sr.get(t))
            total_diff += len(diff)
            fmt = lambda c: f"{c['run']}/{c['failure']}/{c['error']}/{c['skipped']}"
            shown = ", ".join(f"{t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]} ({br.get(t, '-')}→{sr.get(t, '-')})"
                              for t in diff[:8])
            if len(diff) > 8:
                shown += f", … {len(diff) - 8} more"
            status = "" if bc == sc else f" (exit {bc} vs {sc})"
            print(f"| {mod} | {fmt(counts(br))} | {fmt(counts(sr))}{status} | {bs:.0f} | {ss:.0f} | "
                  f"{len(diff)}{': ' + shown if shown else ''} |", flush=True)
            if sc == "hang" or bc == "hang":
                print(f"<!-- {mod}: bare {btail} supervised {stail} -->", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if total_diff else 0


if __name__ == "__main__":
    sys.exit(main())
