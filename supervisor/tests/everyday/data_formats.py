"""Ordinary data work: json/csv/pickle/shelve, compression, hashing, logging to a file."""
import bz2, csv, gzip, hashlib, json, logging, lzma, os, pickle, shelve, tempfile

with tempfile.TemporaryDirectory() as d:
    rows = [{"name": f"n{i}", "value": i * i} for i in range(20)]
    with open(os.path.join(d, "x.json"), "w") as f:
        json.dump(rows, f)
    with open(os.path.join(d, "x.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["name", "value"])
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(d, "x.csv")) as f:
        print("csv", sum(int(r["value"]) for r in csv.DictReader(f)))
    for mod, ext in [(gzip, "gz"), (bz2, "bz2"), (lzma, "xz")]:
        p = os.path.join(d, "x." + ext)
        with mod.open(p, "wb") as f:
            f.write(b"data " * 1000)
        with mod.open(p) as f:
            print(ext, hashlib.sha256(f.read()).hexdigest()[:16])
    with shelve.open(os.path.join(d, "shelf")) as s:
        s["k"] = rows[:2]
    with shelve.open(os.path.join(d, "shelf")) as s:
        print("shelve", s["k"])
    print("pickle", pickle.loads(pickle.dumps(rows))[3])
    log = os.path.join(d, "app.log")
    logging.basicConfig(filename=log, level=logging.INFO, format="%(levelname)s %(message)s")
    logging.info("hello")
    logging.shutdown()
    print("log", open(log).read().strip())
    with tempfile.NamedTemporaryFile("w+", dir=d) as f:
        f.write("named")
        f.flush()
        print("named", open(f.name).read())
    with tempfile.SpooledTemporaryFile(max_size=10) as f:
        f.write(b"x" * 100)
        f.seek(0)
        print("spooled", len(f.read()))
