#!/usr/bin/env python3
"""CPython's own regression tests, bare and under sigma-supervise, side by side.

    scripts/regrtest-compare.py [--supervisor PATH] [--python PY] [--timeout S]
        [--ignore PATTERN]... [-- SUP-ARGS...] MODULE...

Each module runs twice with the same interpreter and flags (`PY -m test --junit-xml F
--timeout S MODULE`): bare, then as `sigma-supervise [SUP-ARGS] PY -m test ...` (the default
profile unless SUP-ARGS say otherwise). Per-test results come from the JUnit XML; the table
lists tests run, failures, errors and skips of both runs, the wall time, and the tests whose
outcome differs. A run that exceeds the timeout is a hang (regrtest's faulthandler dumps and
exits). `--ignore PATTERN` is passed to both runs (regrtest's `-i`), for a test that cannot
end once a deliberate refusal broke it. Results go to stdout as a Markdown table (for TRANSPARENCY.md).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--supervisor", default=os.path.join(
        os.path.dirname(__file__), "..", "target", "debug", "sigma-supervise"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=int, default=900,
                    help="per-module regrtest timeout in seconds (a hang past it fails)")
    ap.add_argument("--ignore", action="append", default=[],
                    help="regrtest -i PATTERN for both runs (repeatable)")
    ap.add_argument("modules", nargs="+")
    args, sup_args = ap.parse_known_args()
    sup_args = [a for a in sup_args if a != "--"]
    sup = os.path.abspath(args.supervisor)
    print(f"| module | bare run/fail/err/skip | supervised run/fail/err/skip | bare s | supervised s | differing tests |")
    print("|---|---|---|---|---|---|")
    total_diff = 0
    for mod in args.modules:
        work = tempfile.mkdtemp(prefix="regrtest-")
        try:
            rows = []
            for label, prefix in (("bare", []), ("sup", [sup, *sup_args])):
                xml = os.path.join(work, f"{label}.xml")
                ignores = [a for pat in args.ignore for a in ("-i", pat)]
                cmd = [*prefix, args.python, "-m", "test", "--junit-xml", xml,
                       "--timeout", str(args.timeout), *ignores, mod]
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
