"""An uncaught exception: the traceback goes to stderr, exit status 1."""
import sys
print("before", flush=True)
sys.stdout.flush()
raise ValueError("expected")
