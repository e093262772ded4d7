"""Queries glibc treats as infallible: umask, times, getrusage, ids, groups, limits."""
import os, resource, time

old = os.umask(0o027)
print("umask", oct(os.umask(old)))
t = os.times()
print("times", all(v >= 0 for v in t[:4]), t.elapsed > 0)
ru = resource.getrusage(resource.RUSAGE_SELF)
print("getrusage", ru.ru_maxrss > 0)
print("children", resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime >= 0)
# In a pid namespace a session led from outside reads as 0 (as under bwrap or unshare -p).
print("pgid", os.getpgid(0) == os.getpgrp(), "sid", os.getsid(0) >= 0)
print("groups", isinstance(os.getgroups(), list))
print("resuid", os.getresuid() == (os.getuid(),) * 3, os.getresgid() == (os.getgid(),) * 3)
print("rlimit", resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 0)
print("cpu", os.cpu_count() > 0, len(os.sched_getaffinity(0)) > 0)
print("loadavg", len(os.getloadavg()))
print("process_time", time.process_time() >= 0, time.thread_time() >= 0)
print("uname", os.uname().sysname)
print("clock", time.clock_getres(time.CLOCK_MONOTONIC) > 0)
