"""Helpers shared by the bench-*.py scripts (imported from the scripts' own directory)."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_supervisor() -> str:
    """The release build of the supervisor that scripts/build made last (the musl build or the
    glibc one; honours CARGO_TARGET_DIR)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    builds = [target / "x86_64-unknown-linux-musl" / "release" / "sigma-supervise",
              target / "release" / "sigma-supervise"]
    present = [b for b in builds if b.exists()]
    if not present:
        return str(builds[-1])
    return str(max(present, key=lambda b: b.stat().st_mtime))


def real_python(python: str = "python3") -> str:
    """The interpreter `python` runs (pyenv's `python3` is a bash shim): measure it, not the shim."""
    out = subprocess.run([python, "-c", "import sys; print(sys.executable)"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()
