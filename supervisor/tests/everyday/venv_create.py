"""venv: create an environment (symlinks) and run its interpreter."""
import os, subprocess, sys, tempfile, venv

with tempfile.TemporaryDirectory() as d:
    env = os.path.join(d, "env")
    venv.create(env, with_pip=False, symlinks=True)
    py = os.path.join(env, "bin", "python")
    print("symlink", os.path.islink(py))
    out = subprocess.run([py, "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                         capture_output=True, text=True)
    print("venv python", out.returncode, out.stdout.strip())
    print("cfg", open(os.path.join(env, "pyvenv.cfg")).read().count("home ="))
