"""Hello world as a σOS proc: Started, a line on stdout, Exited OK.

Installed as e2e-hello.py-v1.0; sigma-supervise's trampoline runs it with the interpreter its
trampoline.toml names (a venv with the pysigma wheel).
"""
import pysigma

pysigma.started()
print("hello, world")
pysigma.exited(pysigma.STATUS_OK, "hello")
