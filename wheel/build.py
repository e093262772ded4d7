#!/usr/bin/env python3
"""The `sigma-supervise` wheel: the release binary as a command, installed the way Python users
install tools (`pip install`, `uv tool install`), with its shell completions and man pages.

    python3 wheel/build.py [-o DIR] [--binary BIN]     prints the wheel's path

The wheel holds what maturin's `bin` bindings put in one (the layout of ruff's and uv's wheels),
but carries the very binary scripts/build links and ships (static, musl, mimalloc, its debug info
split off) rather than a second cargo build with maturin's own flags:

    sigma_supervise-VERSION.data/scripts/sigma-supervise                     -> bin/ (PATH)
    sigma_supervise-VERSION.data/data/share/man/man1/sigma-supervise{,-publish}.1
    sigma_supervise-VERSION.data/data/share/bash-completion/completions/sigma-supervise
    sigma_supervise-VERSION.data/data/share/zsh/site-functions/_sigma-supervise
    sigma_supervise-VERSION.data/data/share/fish/vendor_completions.d/sigma-supervise.fish
    sigma_supervise-VERSION.dist-info/{METADATA,WHEEL,RECORD}

The completions and pages are the binary's own (`generate-shell-completion`, `generate-man-page`),
so they match its command line. A static binary runs on any Linux of its architecture, glibc or
musl: it is tagged manylinux_2_17 and musllinux_1_2; a dynamic one (scripts/build's fallback)
only linux_ARCH, for this machine. Only the standard library: no build backend to install.
"""
import argparse
import base64
import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "sigma-supervise"
DIST = "sigma_supervise"
# A fixed time in the archive: the same binary gives the same wheel.
EPOCH = (1980, 1, 1, 0, 0, 0)


def description() -> str:
    text = (ROOT / "supervisor" / "Cargo.toml").read_text()
    found = re.search(r'^description = "(.*)"$', text, re.M)
    return found.group(1) if found else NAME


def run(binary: Path, *args: str) -> bytes:
    return subprocess.run([str(binary), *args], check=True, capture_output=True).stdout


def is_static(binary: Path) -> bool:
    """No PT_INTERP program header: the kernel runs it without a dynamic loader."""
    data = binary.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        sys.exit(f"wheel: {binary} is not a 64-bit little-endian ELF binary")
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    for i in range(phnum):
        off = phoff + i * phentsize
        if int.from_bytes(data[off:off + 4], "little") == 3:  # PT_INTERP
            return False
    return True


def platform_tag(binary: Path) -> str:
    arch = platform.machine()
    if is_static(binary):
        return f"manylinux_2_17_{arch}.manylinux2014_{arch}.musllinux_1_2_{arch}"
    return f"linux_{arch}"


def contents(binary: Path, data: str, scripts: str) -> list[tuple[str, bytes, int]]:
    """(path in the wheel, bytes, mode) of everything but the metadata."""
    files = [(f"{scripts}/{NAME}", binary.read_bytes(), 0o755)]
    share = f"{data}/share"
    for shell, path in (("bash", f"bash-completion/completions/{NAME}"),
                        ("zsh", f"zsh/site-functions/_{NAME}"),
                        ("fish", f"fish/vendor_completions.d/{NAME}.fish")):
        script = run(binary, "generate-shell-completion", shell)
        if not script.strip():
            sys.exit(f"wheel: {binary} generated an empty {shell} completion")
        files.append((f"{share}/{path}", script, 0o644))
    with tempfile.TemporaryDirectory() as pages:
        run(binary, "generate-man-page", pages)
        for page in sorted(Path(pages).iterdir()):
            files.append((f"{share}/man/man1/{page.name}", page.read_bytes(), 0o644))
    return files


def record_line(path: str, body: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(body)}"


def build(binary: Path, out: Path) -> Path:
    version_line = run(binary, "--version").decode().split()
    if len(version_line) != 2 or version_line[0] != NAME:
        sys.exit(f"wheel: {binary} --version says {' '.join(version_line)!r}")
    version = version_line[1]
    tag = platform_tag(binary)
    info = f"{DIST}-{version}.dist-info"
    data = f"{DIST}-{version}.data"
    files = contents(binary, f"{data}/data", f"{data}/scripts")
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version}",
        f"Summary: {description()}",
        "License: Apache-2.0",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Programming Language :: Rust",
        "Classifier: Environment :: Console",
        "",
    ])
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: sigma-supervise wheel/build.py",
        "Root-Is-Purelib: false",
        *(f"Tag: py3-none-{t}" for t in tag.split(".")),
        "",
    ])
    files += [(f"{info}/METADATA", metadata.encode(), 0o644),
              (f"{info}/WHEEL", wheel.encode(), 0o644)]
    record = "\n".join([*(record_line(p, b) for p, b, _ in files), f"{info}/RECORD,,", ""])
    files.append((f"{info}/RECORD", record.encode(), 0o644))

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{DIST}-{version}-py3-none-{tag}.whl"
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body, mode in files:
            entry = zipfile.ZipInfo(name, EPOCH)
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, body)
    os.replace(tmp, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=None,
                    help="directory of the wheel (default: the target dir's wheels/)")
    ap.add_argument("--binary", type=Path, default=None,
                    help="the binary to carry (default: scripts/build's, built now)")
    args = ap.parse_args()
    binary = args.binary
    if binary is None:
        built = subprocess.run([str(ROOT / "scripts" / "build")], check=True,
                               stdout=subprocess.PIPE, text=True)
        binary = Path(built.stdout.strip().splitlines()[-1])
    out = args.out
    if out is None:
        target = os.environ.get("CARGO_TARGET_DIR", str(ROOT / "target"))
        out = (ROOT / target) / "wheels"
    print(build(binary.resolve(), out))


if __name__ == "__main__":
    main()
