# σPy's pyproc/file_test.py call sequence (the path is under the local ux server).
import sys

import splib

splib.Started()
# File creation
pathname = sys.argv[1] + "/my_file"
fd = splib.Create(pathname, 777, 0x01)
print("Fd:", fd)
# Write to file
data = "hello"
written = splib.Write(fd, data)
print("Written:", written)
splib.CloseFD(fd)
# Get the file contents
contents = splib.GetFile(pathname)
print("Contents:", contents)
splib.Exited(1, "Exited normally!")
