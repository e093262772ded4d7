# σPy's pyproc/stat_test.py: times each σOS API call once, local (ux) then remote (s3).
# argv[1] is the local directory, argv[2] the bucket path (σPy used name/ and a real bucket).
import ctypes
import sys
import time

import splib

local, remote = sys.argv[1], sys.argv[2]
results = []


def timed(label, fn, *args):
    ms_start = time.time() * 1000.0
    out = fn(*args)
    ms_end = time.time() * 1000.0
    results.append((label, ms_end - ms_start))
    return out


timed("Started", splib.Started)

# Local
timed("PutFile_Local", splib.PutFile, local + "/pystat_file", 777, 0, "Hello World!", 0, 0)
file_contents = timed("GetFile_Local", splib.GetFile, local + "/pystat_file")
assert file_contents == b"Hello World!", file_contents
st = timed("Stat_Local", splib.Stat, local + "/pystat_file")
assert st.length == 12, st
fd = timed("Create_Local", splib.Create, local + "/pystat_file_2", 777, 2)
timed("Write_Local", splib.Write, fd, "Hello!")
timed("CloseFD_Local", splib.CloseFD, fd)
fd = timed("Open_Local", splib.Open, local + "/pystat_file_2", 2, False)
timed("Seek_Local", splib.Seek, fd, 0)
buf = ctypes.create_string_buffer(10)
n = timed("Read_Local", splib.Read, fd, buf)
assert (n, buf.raw[:n]) == (6, b"Hello!"), (n, buf.raw)
timed("CloseFD_Local", splib.CloseFD, fd)
timed("Remove_Local", splib.Remove, local + "/pystat_file")
timed("Remove_Local", splib.Remove, local + "/pystat_file_2")

# Remote
timed("PutFile_Remote", splib.PutFile, remote + "/pystat_file", 777, 0, "Hello World!", 0, 0)
file_contents = timed("GetFile_Remote", splib.GetFile, remote + "/pystat_file")
assert file_contents == b"Hello World!", file_contents
timed("Stat_Remote", splib.Stat, remote + "/pystat_file")
timed("Remove_Remote", splib.Remove, remote + "/pystat_file")

timed("Exited", splib.Exited, 1, "Exited normally!")

for r in results:
    print(r[0], r[1])
