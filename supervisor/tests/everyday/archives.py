"""zipfile, tarfile (gz, bz2, xz) and shutil archives: create, list, extract with times."""
import os, pathlib, shutil, tarfile, tempfile, zipfile

with tempfile.TemporaryDirectory() as d:
    src = pathlib.Path(d, "data")
    (src / "pkg").mkdir(parents=True)
    for i in range(5):
        (src / "pkg" / f"m{i}.py").write_text(f"X = {i}\n" * 50)
    os.symlink("m0.py", src / "pkg" / "alias.py")
    for p in src.rglob("*"):
        os.utime(p, (1_600_000_000, 1_600_000_000), follow_symlinks=False)
    zp = pathlib.Path(d, "a.zip")
    with zipfile.ZipFile(zp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(src.rglob("*.py")):
            z.write(p, p.relative_to(src))
    with zipfile.ZipFile(zp) as z:
        print("zip", z.namelist(), z.testzip())
        z.extractall(pathlib.Path(d, "unzipped"))
    print("unzipped", sorted(os.listdir(pathlib.Path(d, "unzipped", "pkg"))))
    for mode in ["gz", "bz2", "xz"]:
        tp = pathlib.Path(d, f"a.tar.{mode}")
        with tarfile.open(tp, f"w:{mode}") as t:
            t.add(src, arcname="data")
        out = pathlib.Path(d, f"out-{mode}")
        with tarfile.open(tp) as t:
            names = sorted(t.getnames())
            t.extractall(out, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(out)
        m = os.lstat(out / "data" / "pkg" / "m1.py").st_mtime
        print("tar", mode, names, m, os.readlink(out / "data" / "pkg" / "alias.py"))
    made = shutil.make_archive(os.path.join(d, "made"), "gztar", root_dir=src)
    shutil.unpack_archive(made, os.path.join(d, "unpacked"))
    print("unpack_archive", sorted(os.listdir(os.path.join(d, "unpacked", "pkg"))))
