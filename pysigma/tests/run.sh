#!/usr/bin/env bash
# Builds the pysigma wheel, installs it into a fresh venv, checks the stubs against the built
# module (mypy.stubtest) and runs the pytest suite against the installed wheel.
#   pysigma/tests/run.sh [pytest args...]
# PYSIGMA_WORK=<dir> keeps the wheel and venv there (default: a temporary directory).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
crate="$(dirname "$here")"
python="${PYTHON:-python3}"

work="${PYSIGMA_WORK:-}"
if [ -z "$work" ]; then
  work="$(mktemp -d -t pysigma-test.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/wheels"
rm -f "$work"/wheels/pysigma-*.whl

echo "pysigma: building the wheel" >&2
"$python" -m maturin build --release -m "$crate/Cargo.toml" -o "$work/wheels" >&2
wheel="$(ls "$work"/wheels/pysigma-*.whl)"

echo "pysigma: installing $(basename "$wheel") into a fresh venv" >&2
rm -rf "$work/venv"
"$python" -m venv "$work/venv"
venv_py="$work/venv/bin/python"
"$venv_py" -m pip install -q --disable-pip-version-check "$wheel" pytest mypy typing_extensions

# test_supervised.py runs the venv's python under sigma-supervise: build it (CARGO_TARGET_DIR aware)
# unless SIGMA_SUPERVISE already names one.
if [ -z "${SIGMA_SUPERVISE:-}" ]; then
  echo "pysigma: building sigma-supervise" >&2
  (cd "$crate/.." && cargo build -q --workspace --bins) >&2
  target="${CARGO_TARGET_DIR:-$crate/../target}"
  case "$target" in /*) ;; *) target="$crate/../$target" ;; esac
  export SIGMA_SUPERVISE="$(cd "$target/debug" && pwd)/sigma-supervise"
fi

# Run from outside the source tree so `import pysigma` can only find the installed wheel.
cd "$work"
"$venv_py" - <<'PY'
import pysigma, pysigma._pysigma as m
assert "site-packages" in pysigma.__file__, pysigma.__file__
print("pysigma: testing", pysigma.__file__, "abi3 module", m.__file__)
PY

echo "pysigma: mypy.stubtest pysigma._pysigma" >&2
"$venv_py" -m mypy.stubtest pysigma._pysigma

echo "pysigma: mypy -p pysigma (the package against its own stubs)" >&2
"$venv_py" -m mypy -p pysigma

echo "pysigma: pytest" >&2
exec "$venv_py" -m pytest -p no:cacheprovider --import-mode=importlib -q "$here" "$@"
