"""A proc that waits to be evicted, as σOS's own evictable procs do: Started, WaitEvict (which
returns when a σOS client calls Evict on this proc), then Exited with status EVICTED.

usage: e2e-evict.py
"""
import pysigma

pysigma.started()
pysigma.client().wait_evict()
pysigma.exited(pysigma.STATUS_EVICTED, "evicted")
