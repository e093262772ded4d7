"""A program of the standard library's everyday parts (json, hashlib, sqlite3 in memory, re,
tempfile, zlib, threads, a subprocess), its result written to name/ux/~local/<OUT> for the
client to check: `{"sha256": ..., "rows": 3, "zlib": true, "thread": 42, "child": "ok"}`.

usage: e2e-stdlib.py OUT
"""
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import zlib

import pysigma

pysigma.started()
out = sys.argv[1]

db = sqlite3.connect(":memory:")
db.execute("create table t (k text, v integer)")
db.executemany("insert into t values (?, ?)", [("a", 1), ("b", 2), ("c", 3)])
rows = db.execute("select count(*) from t").fetchone()[0]

with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "x")
    with open(p, "wb") as f:
        f.write(b"sigma" * 1000)
    with open(p, "rb") as f:
        data = f.read()

box = []
t = threading.Thread(target=lambda: box.append(6 * 7))
t.start()
t.join()
child = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True)

result = {
    "sha256": hashlib.sha256(data).hexdigest(),
    "rows": rows,
    "zlib": zlib.decompress(zlib.compress(data)) == data,
    "re": bool(re.fullmatch(r"(sigma)+", data.decode())),
    "thread": box[0],
    "child": child.stdout.strip(),
}
pysigma.put_file("name/ux/~local/" + out, json.dumps(result, sort_keys=True).encode())
pysigma.exited(pysigma.STATUS_OK, "stdlib")
