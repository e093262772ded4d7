"""Imports `greet`, a library installed nowhere on the machine: the supervisor fetches it from
the realm's bucket (a file:// bucket that `sigma-supervise publish` made of examples/demo-lib)
on first import. Writes greet.hello(NAME) and where greet came from to name/ux/~local/<OUT>.

usage: e2e-realm.py OUT NAME
"""
import json
import sys

import pysigma

pysigma.started()
import greet  # noqa: E402  (fetched lazily from the bucket)

out, name = sys.argv[1], sys.argv[2]
pysigma.put_file(
    "name/ux/~local/" + out,
    json.dumps({"hello": greet.hello(name), "file": greet.__file__}).encode(),
)
pysigma.exited(pysigma.STATUS_OK, "realm")
