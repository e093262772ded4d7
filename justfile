# Everyday commands. `scripts/bootstrap` installs what they need (just itself comes from `pip install rust-just`).

default:
    @just --list

# Install system and Python prerequisites and the pinned MinIO.
bootstrap:
    scripts/bootstrap

# Formatting and clippy over the whole workspace.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets

# Layout rules (module cycles, file and supervisor sizes), first proven on a throwaway crate.
layout:
    scripts/check-layout --self-test
    scripts/check-layout

# The README's test command: every test, as CI runs it.
test:
    scripts/test

# criterion benches plus the side-by-side comparisons against bare python3.
bench:
    cargo bench
    python3 scripts/bench-import.py

# Each libFuzzer target (fuzz/) for FUZZ_SECONDS (default 60) from the golden-vector seeds.
fuzz:
    scripts/fuzz

# Build the pysigma abi3 wheel into target/wheels.
wheel:
    python3 -m maturin build --release -m pysigma/Cargo.toml -o target/wheels

# The README's demo.
demo:
    scripts/demo

# Release build of the supervisor, linked statically (scripts/build).
build:
    scripts/build
