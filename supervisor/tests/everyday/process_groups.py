"""A process group and session the program can name (not 0), as programs that manage their
own process groups expect; a child in a new group of its own."""
import os
import subprocess
import sys

print("pgrp", os.getpgrp() != 0, "sid", os.getsid(0) != 0)
print("pgid is pgrp", os.getpgid(0) == os.getpgrp())
out = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpgrp() == os.getpid())"],
    process_group=0,
    capture_output=True,
    text=True,
).stdout.strip()
print("child leads its group", out)
