"""Helpers shared by the bench-*.py scripts (imported from the scripts' own directory)."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_supervisor() -> str:
    """The release build of the supervisor (honours CARGO_TARGET_DIR)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "release" / "sigma-supervise")


def real_python(python: str = "python3") -> str:
    """The interpreter `python` runs (pyenv's `python3` is a bash shim): measure it, not the shim."""
    out = subprocess.run([python, "-c", "import sys; print(sys.executable)"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()
