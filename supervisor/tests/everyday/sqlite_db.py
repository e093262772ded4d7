"""sqlite3 on disk: journal and WAL writes, transactions, a second connection."""
import os, sqlite3, tempfile

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "db.sqlite")
    con = sqlite3.connect(path)
    con.execute("create table t (k integer primary key, v text)")
    with con:
        con.executemany("insert into t (v) values (?)", [(f"row{i}",) for i in range(500)])
    try:
        with con:
            con.execute("insert into t (k, v) values (1, 'dup')")
    except sqlite3.IntegrityError as e:
        print("integrity", e)
    print("count", con.execute("select count(*) from t").fetchone()[0])
    print("wal", con.execute("pragma journal_mode=wal").fetchone()[0])
    with con:
        con.execute("update t set v = 'changed' where k <= 10")
    other = sqlite3.connect(path)
    print("other sees", other.execute("select count(*) from t where v = 'changed'").fetchone()[0])
    other.close()
    con.execute("vacuum")
    con.close()
    print("files", sorted(f for f in os.listdir(d) if not f.endswith("-shm")))
