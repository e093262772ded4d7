# σPy's pyproc/hello.py shape: mark started, do the work, mark exited.
import splib

splib.Started()
print("Hello World!")
splib.Exited(1, "Exited normally!")
