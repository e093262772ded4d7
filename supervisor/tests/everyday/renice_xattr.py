"""Renicing a child by pid (nicer only), and user.* extended attributes on a file in the
working directory."""
import errno
import os
import subprocess
import sys

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
try:
    before = os.getpriority(os.PRIO_PROCESS, child.pid)
    os.setpriority(os.PRIO_PROCESS, child.pid, before + 5)
    print("reniced by", os.getpriority(os.PRIO_PROCESS, child.pid) - before)
finally:
    child.kill()
    child.wait()

path = "xattr-file.txt"
with open(path, "w") as f:
    f.write("x")
try:
    os.setxattr(path, "user.color", b"blue")
    print("get", os.getxattr(path, "user.color"))
    print("list", [n for n in os.listxattr(path) if n.startswith("user.")])
    with open(path) as f:
        os.setxattr(f.fileno(), "user.shape", b"round")
    os.removexattr(path, "user.color")
    print("after remove", sorted(n for n in os.listxattr(path) if n.startswith("user.")))
    try:
        os.getxattr(path, "user.missing")
    except OSError as e:
        print("missing", errno.errorcode[e.errno])
finally:
    os.unlink(path)
