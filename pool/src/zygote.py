# The zygote: `python3 -c "exec(<this, read from stdin>)" CTL_FD PRELOADS`, started by the pool.
# It imports PRELOADS (comma-separated), freezes the heap, forks its first proc ahead of any
# request (a ready proc: forked, its σcontainer made as far as no request changes it, its
# signals and /proc/self/stat taken), says "ready" on CTL_FD, then hands each client
# connection the pool passes it to the ready proc. That proc reads the client's request itself
# (identity, the compiled filter, stdio and the report pipe, which it passes back to the
# zygote), completes its σcontainer, installs the proc's filter with its own listener, hands
# pidfd + listener to the client, waits for "go", takes the identity and runs the program as
# `python3 script.py`, `-c CODE` or `-m MODULE` would. No client holds the zygote up.
# The zygote makes the next ready proc once that one has ended or run for AHEAD (a fork beside
# a starting proc would slow it down), reaps its procs and writes how each ended to its
# client's report pipe (jail::init::Ended's two bytes).
# Nothing here is left in sys.modules for the program but what the preloads imported.
# Preloads come from the interpreter's own sys.path: '' (the pool's working directory) is left
# out while they are imported. A preload that fails is named on CTL_FD ("failed NAME: why").
# When the pool learns preloads, each proc writes at its end which of the program's import
# names it imported itself from the interpreter's own path (a shared page, no descriptor);
# the zygote sends them to the pool after reaping it (sigma-pool's learn.rs).
_BASE_MAIN = dict(globals())
import sys


# State a cold start draws from the system's entropy at import, which a fork would copy to every
# sibling: each proc draws its own before the program runs, for each module the zygote has.
# Not here, as they need nothing: secrets, uuid.uuid4 and os.urandom (the kernel's, per call),
# tempfile's name sequence (made anew once the pid differs), ssl (OpenSSL's generator reseeds
# after a fork), numpy.random.default_rng() (fresh entropy per call). The interpreter's hash
# seed and the address-space layout stay shared with siblings (pool recycling bounds that).
RESEED = {
    # The module-level generator (it also reseeds itself at fork, os.register_at_fork).
    "random": lambda m: m.seed(),
    # numpy's legacy global RandomState (np.random.rand, np.random.seed).
    "numpy.random": lambda m: m.seed(),
    # The main process's authentication key, 32 random bytes at import: connections between
    # a proc's processes (Manager, Listener/Client) are authenticated with it.
    "multiprocessing.process": lambda m: setattr(
        m.current_process(), "authkey", __import__("os").urandom(32)),
}


def _recv_fds(sock, size, maxfds, flags=0):
    # socket.recv_fds, with its flags honoured (the library's drops them: MSG_DONTWAIT would
    # block). Returns (message, descriptors).
    import array, socket
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(maxfds * fds.itemsize), flags)
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


class _Jail:
    """A jailed zygote's side of each proc's σcontainer (`sigma-supervise --zygote-ctl`).

    The zygote runs in a jail built as a cold proc's, less the run's own binds, without
    Landlock. Before its preloads it enters a user namespace of its own (mapping its ids to
    themselves: any process may; it gains nothing over the jail's objects) and a pid namespace
    it leads, so that it may make and join namespaces for its children:

        Z (the jail's program) ── unshare(USER), unshare(PID), fork ──▶ Z2 (the zygote, pid 1)
        Z2 ── fork (before its preloads: small) ──▶ F, which on Z2's word makes a spare:
              unshare(PID|NET|IPC|UTS), fork ──▶ I (pid 1, loopback up), setns back
        Z2 per proc, ahead: setns(I, PID), fork ──▶ C (pid 2 of I's namespace), setns back

    C, before its request (`prepare`): joins I's network, IPC and UTS namespaces, makes a
    mount namespace and builds a root of its own (a tmpfs; the zygote's view bound in entry by
    entry, a new /proc, /dev/shm and /dev/pts). On its request (`complete`): attaches the
    run's own binds from the trees its client cloned (a top-level directory on their way made
    anew entry by entry), mounts /tmp, pivots into the root, makes it read-only, drops every
    capability, sets no_new_privs and Landlock, then installs the proc's filter as an unjailed
    zygote's child does. When C ends, I is killed, and with it what C left running, as a cold
    jail's init ends its proc.
    """

    NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (
        0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

    def __init__(self):
        import ctypes, os, socket
        self.libc = libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        uid, gid = os.geteuid(), os.getegid()
        self.check(libc.unshare(self.NEWUSER), "a user namespace of its own")
        for f, data in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                        ("gid_map", "%d %d 1" % (gid, gid))):
            with open("/proc/self/" + f, "w") as fh:
                fh.write(data)
        self.check(libc.unshare(self.NEWPID), "a pid namespace")
        pid = os.fork()
        if pid:
            # Z: ends as the zygote does (and the jail with it).
            os.closerange(3, 1 << 20)
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
                except InterruptedError:
                    continue
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: Z's end is ours
        self.pz = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if os.fork() == 0:
            # F, in the zygote's pid namespace: makes spares until the zygote is gone.
            libc.prctl(1, 9, 0, 0, 0)
            ours.close()
            a, b = sorted((theirs.fileno(), self.pz))
            os.closerange(3, a)
            os.closerange(a + 1, b)
            os.closerange(b + 1, 1 << 20)
            self.make_spares(theirs)
        theirs.close()
        self.maker = ours
        self.spares = []
        self.asked = 0
        self.inits = {}  # proc pid -> its I's pidfd
        # Newest first, as tmpfs lists: the child makes them oldest first, so its / lists as
        # the zygote's (and a cold proc's) does.
        self.root = os.listdir("/")[::-1]

    def check(self, r, what):
        if r != 0:
            import ctypes, os
            raise OSError(ctypes.get_errno(), "%s: %s" % (what, os.strerror(ctypes.get_errno())))

    def make_spares(self, sock):
        import os, signal, socket
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # Is end unreaped
        flags = self.NEWPID | self.NEWNET | self.NEWIPC | self.NEWUTS
        while True:
            try:
                m = sock.recv(16)
            except InterruptedError:
                continue
            if not m:
                os._exit(0)
            if self.libc.unshare(flags) != 0:
                sock.send(b"E")
                continue
            pid = os.fork()
            if pid == 0:
                self.spare_init()
            self.check(self.libc.setns(self.pz, self.NEWPID), "back to the zygote's pid namespace")
            fd = os.pidfd_open(pid)
            socket.send_fds(sock, [b"S"], [fd])
            os.close(fd)

    def spare_init(self):
        # I: pid 1 of a proc's namespaces, loopback up; orphans reaped (SIGCHLD ignored).
        import fcntl, os, signal, socket, struct
        os.closerange(3, 1 << 20)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", 0x1 | 0x8 | 0x40, b""))
        while True:
            signal.pause()

    def ask(self, n=1):
        for _ in range(n):
            self.maker.send(b"s")
            self.asked += 1

    def take(self, wait):
        # The spares made since, without waiting unless none is at hand.
        import socket
        while self.asked:
            try:
                flags = 0 if wait and not self.spares else socket.MSG_DONTWAIT
                m, fds = _recv_fds(self.maker, 16, 1, flags)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            if not m:
                raise OSError("the zygote's spare maker is gone")
            self.asked -= 1
            self.spares.extend(fds)
            if m != b"S" and not self.spares and wait:
                raise OSError("no namespaces for the proc")

    def fork(self, fork):
        # The proc forked into a spare's pid namespace (pid 2), the next spare asked for.
        import os
        self.take(False)
        if not self.spares:
            if not self.asked:
                self.ask()
            self.take(True)
        init = self.spares.pop(0)
        self.check(self.libc.setns(init, self.NEWPID), "the proc's pid namespace")
        pid = fork()
        if pid == 0:
            return 0, init
        self.check(self.libc.setns(self.pz, self.NEWPID), "back to the zygote's pid namespace")
        self.inits[pid] = init
        self.ask()
        return pid, init

    def ended(self, pid):
        # The proc's I ends with it (SIGKILL: what the proc left running ends too).
        import os
        init = self.inits.pop(pid, None)
        if init is not None:
            self.libc.syscall(424, init, 9, None, 0)  # pidfd_send_signal
            os.close(init)

    T = b"/tmp"  # where a proc's root is built, in its own mount namespace

    def mount(self, src, dst, fs, flags, data=None):
        self.check(self.libc.mount(src, dst, fs, flags, data),
                   "mount %s" % (dst.decode(errors="replace") if dst else ""))

    def fill(self, d, names, needed):
        # The zygote's view of directory d, entry by entry, into the root being built: a
        # directory on the way to one of the run's binds is made and filled in turn, any other
        # bound whole, a symbolic link copied, a file bound over an empty one.
        import os
        T = self.T
        for name in names:
            p = os.path.join(d, name)
            t = T + p
            if d == b"/" and name in (b"proc", b"tmp"):
                os.mkdir(t, 0o555)  # mounted on
                continue
            if p in needed and os.path.isdir(p) and not os.path.islink(p):
                os.mkdir(t)
                self.fill(p, os.listdir(p), needed)
            elif os.path.islink(p):
                os.symlink(os.readlink(p), t)
            elif os.path.isdir(p):
                os.mkdir(t)
                self.mount(p, t, None, self.MS_BIND | self.MS_REC)
            else:
                os.close(os.open(t, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o444))
                self.mount(p, t, None, self.MS_BIND)

    def prepare(self, init):
        """In a ready child, before any request: the proc's namespaces joined and its root
        built from the zygote's view, every top-level entry bound whole, with a new /proc,
        /dev/shm and /dev/pts. The request's part is [`complete`]."""
        import os
        libc, mount, T = self.libc, self.mount, self.T
        self.check(libc.setns(init, self.NEWNET | self.NEWIPC | self.NEWUTS),
                   "the proc's network namespace")
        self.check(libc.unshare(self.NEWNS), "a mount namespace")
        mount(None, b"/", None, self.MS_REC | self.MS_PRIVATE)
        mount(b"tmpfs", T, b"tmpfs", self.MS_NOSUID | self.MS_NODEV, b"mode=0755")
        self.fill(b"/", [os.fsencode(n) for n in self.root], set())
        mount(b"proc", T + b"/proc", b"proc", self.MS_NOSUID | self.MS_NODEV | self.MS_NOEXEC)
        for p in (b"/proc/sys", b"/proc/sysrq-trigger", b"/proc/irq", b"/proc/bus"):
            if os.path.exists(T + p):
                mount(T + p, T + p, None, self.MS_BIND | self.MS_REC)
                mount(None, T + p, None, self.MS_REMOUNT | self.MS_BIND | self.MS_RDONLY
                      | self.MS_NOSUID | self.MS_NODEV | self.MS_NOEXEC)
        self.own_dev()

    def own_dev(self):
        # The proc's own /dev/shm and /dev/pts, over the zygote's.
        import os
        mount, T = self.mount, self.T
        if os.path.isdir(T + b"/dev/shm"):
            mount(b"tmpfs", T + b"/dev/shm", b"tmpfs", self.MS_NOSUID | self.MS_NODEV, b"mode=1777")
        if os.path.isdir(T + b"/dev/pts"):
            mount(b"devpts", T + b"/dev/pts", b"devpts", self.MS_NOSUID | self.MS_NOEXEC,
                  b"newinstance,ptmxmode=0666,mode=620")

    def complete(self, j, trees):
        """In the proc, on its request: the run's own binds attached, /tmp, what it hides, the
        pivot, its own user namespace, Landlock and no capability left. Err: why not."""
        import os, struct
        libc, mount, T = self.libc, self.mount, self.T
        binds = [(os.fsencode(os.fsdecode(bytes.fromhex(d))), isdir, fd)
                 for (d, isdir), fd in zip(j["binds"], trees)]
        needed = set()
        for dst, _, _ in binds:
            p = os.path.dirname(dst)
            while p != b"/":
                needed.add(p)
                p = os.path.dirname(p)
        # A top-level directory on the way to a bind was bound whole ahead: made anew, filled
        # entry by entry (the bind needs a mount point the zygote's view does not have). The
        # proc's own /dev/shm and /dev/pts go with /dev: mounted again over the zygote's.
        for name in self.root:
            p = b"/" + os.fsencode(name)
            if (p in needed and p not in (b"/proc", b"/tmp") and os.path.isdir(p)
                    and not os.path.islink(p)):
                self.check(libc.umount2(T + p, 2), "unbinding %s" % name)  # MNT_DETACH
                self.fill(p, os.listdir(p), needed)
                if p == b"/dev":
                    self.own_dev()
        mount(b"tmpfs", T + b"/tmp", b"tmpfs", self.MS_NOSUID | self.MS_NODEV,
              b"mode=1777,size=%d" % int(j.get("tmp_size", 1 << 30)))
        for dst, isdir, fd in sorted(binds, key=lambda b: b[0].count(b"/")):
            t = T + dst
            if isdir:
                os.makedirs(t, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(t), exist_ok=True)
                if not os.path.lexists(t):
                    os.close(os.open(t, os.O_CREAT | os.O_WRONLY, 0o444))
            self.check(libc.syscall(429, fd, b"", -100, t, 4), "attaching %s" % os.fsdecode(dst))
        # What the run hides under its own binds, as a cold jail hides it: an empty read-only
        # tmpfs over a directory, an empty file over a file.
        empty = T + b"/tmp/.sigma-empty"
        for h in j.get("hides", []):
            t = T + os.fsencode(os.fsdecode(bytes.fromhex(h)))
            if os.path.islink(t) or not os.path.lexists(t):
                continue
            if os.path.isdir(t):
                mount(b"tmpfs", t, b"tmpfs", self.MS_RDONLY | self.MS_NOSUID | self.MS_NODEV
                      | self.MS_NOEXEC, b"mode=0555,size=4k")
            else:
                if not os.path.exists(empty):
                    os.close(os.open(empty, os.O_CREAT | os.O_WRONLY, 0o444))
                mount(empty, t, None, self.MS_BIND)
                mount(None, t, None, self.MS_REMOUNT | self.MS_BIND | self.MS_RDONLY
                      | self.MS_NOSUID | self.MS_NODEV | self.MS_NOEXEC)
        if os.path.exists(empty):
            os.unlink(empty)
        os.chdir(T)
        self.check(libc.syscall(155, b".", b"."), "pivot_root")
        self.check(libc.umount2(b".", 2), "detaching the zygote's root")
        os.chdir("/")
        mount(None, b"/", None, self.MS_REMOUNT | self.MS_BIND | self.MS_RDONLY
              | self.MS_NOSUID | self.MS_NODEV)
        # A user namespace of its own (its ids mapped to themselves): its process count is its
        # own, not shared with its siblings, and bounded by the run's limit.
        uid, gid = os.geteuid(), os.getegid()
        self.check(libc.unshare(self.NEWUSER), "a user namespace of the proc's own")
        for f, data in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                        ("gid_map", "%d %d 1" % (gid, gid))):
            fd = os.open("/proc/self/" + f, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, data.encode())
            finally:
                os.close(fd)
        if j.get("pids"):
            import resource
            resource.setrlimit(resource.RLIMIT_NPROC, (j["pids"], j["pids"]))
        # No capability left, none to regain (securebits locked), no new privileges.
        self.check(libc.prctl(28, 0xEF, 0, 0, 0), "securebits")
        for cap in range(64):
            if libc.prctl(24, cap, 0, 0, 0) != 0:
                break
        libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
        hdr = struct.pack("Ii", 0x20080522, 0)
        self.check(libc.syscall(126, hdr, bytes(24)), "dropping capabilities")
        self.check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
        if j.get("landlock"):
            self.landlock([os.fsdecode(bytes.fromhex(w)) for w in j.get("writable", [])])

    def landlock(self, writable):
        # As a cold jail's: read and execute anywhere, write where the proc may; signals and
        # abstract sockets scoped to it (ABI 6).
        import os, struct
        libc = self.libc
        abi = libc.syscall(444, None, 0, 1)
        if abi <= 0:
            return
        handled = (1 << 13) - 1
        for v, bit in ((2, 13), (3, 14), (5, 15)):
            if abi >= v:
                handled |= 1 << bit
        scoped = 3 if abi >= 6 else 0
        size = 24 if abi >= 6 else 16 if abi >= 4 else 8
        rs = libc.syscall(444, struct.pack("QQQ", handled, 0, scoped), size, 0)
        if rs < 0:
            self.check(-1, "a Landlock ruleset")
        file_only = 1 | 2 | 4 | (1 << 14) | (1 << 15)

        def rule(path, access):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            if not os.path.isdir(path):
                access &= file_only
            r = libc.syscall(445, rs, 1, struct.pack("=Qi", access & handled, fd), 0)
            os.close(fd)
            self.check(0 if r == 0 else -1, "a Landlock rule for %s" % path)
        rule("/", 1 | 4 | 8)
        for w in ["/tmp", "/dev/shm", "/dev/pts"] + writable:
            rule(w, handled)
        self.check(libc.syscall(446, rs, 0), "Landlock")
        os.close(rs)


def _zygote():
    # Locals, not globals: the child empties __main__'s namespace for the program.
    import sys
    base_main = _BASE_MAIN
    ctl_fd = int(sys.argv[1])
    preloads = [p for p in sys.argv[2].split(",") if p]
    import _thread
    startup = {m.partition(".")[0] for m in sys.modules}
    jail = None
    if sys.argv[3:4] == ["jailed"]:
        before = set(sys.modules)
        jail = _Jail()
        # What that imported is not the preloads': dropped, so a proc never carries it.
        for name in set(sys.modules) - before:
            del sys.modules[name]
    own = [p for p in sys.path if p]  # the interpreter's own path, without ''
    first = sys.path[:1]
    sys.path[:] = own
    # Every preload that no finder of the interpreter's finds, named at once.
    missing = [n for n in preloads
               if not any(getattr(f, "find_spec", lambda *a: None)(n, None) for f in sys.meta_path)]
    if missing:
        import socket
        why = "failed %s: not found on the interpreter's path" % ",".join(missing)
        socket.socket(fileno=ctl_fd).send(why.encode()[:4000])
        __import__("os")._exit(4)
    for name in preloads:
        try:
            __import__(name)
            if _thread._count():
                raise ImportError("it started a thread")
        except BaseException as e:
            import socket
            why = "failed %s: %s" % (name, str(e).splitlines()[0] if str(e) else type(e).__name__)
            socket.socket(fileno=ctl_fd).send(why.encode()[:4000])
            sys.stderr.flush()
            __import__("os")._exit(4)
    sys.path[:0] = [p for p in first if not p]
    keep = set(sys.modules)
    import os, gc, json, signal, socket, ctypes, threading, io, fcntl, resource, mmap, time
    own_dirs = {os.path.abspath(p) for p in own}
    pages = {}  # child pid -> the page it writes its imported names to

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the pool's end is ours
    nr_seccomp = {"x86_64": 317, "aarch64": 277}[os.uname().machine]

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    ctl = socket.socket(fileno=ctl_fd)
    ended = {}  # child pid -> the client's report pipe
    pending = {}  # child pid -> (its Ready, learning), handed a client not yet taken
    early = {}  # child pid -> its report, for one that ended before it was taken

    def reap(*_):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if jail is not None:
                jail.ended(pid)
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                report = bytes([(128 + sig) & 0xFF, sig])
            else:
                report = bytes([os.WEXITSTATUS(status) & 0xFF, 0])
            if pid in ended:
                finish(pid, report)
            elif pid in pending:
                early[pid] = report  # said once its report pipe is here (taken)
            # Else a ready proc that ended unasked, or before it took its request.

    def finish(pid, report):
        # How the proc ended, to its client; what it imported, to the pool.
        fd = ended.pop(pid)
        try:
            os.write(fd, report)
        except OSError:
            pass
        os.close(fd)
        page = pages.pop(pid, None)
        if page is not None:
            send_imported(page)

    def send_imported(page):
        # What the proc wrote is untrusted: bounded, each name checked, at most 32.
        n = int.from_bytes(page[:4], "little")
        raw = page[4:4 + n] if 0 <= n <= len(page) - 4 else b""
        page.close()
        names = [m for m in raw.decode("ascii", "replace").split(",")
                 if m.isascii() and m.isidentifier() and len(m) <= 64][:32]
        try:
            ctl.send(json.dumps({"imported": names}).encode(), socket.MSG_DONTWAIT)
        except OSError:
            pass

    def record(page, imports, excluded):
        # Of the program's import names, those it imported itself (not at start-up), each
        # from a directory of the interpreter's own sys.path and not the script's directory
        # or the working directory: no user code is ever named. No system call.
        try:
            names = []
            for name in imports:
                mod = sys.modules.get(name)
                if mod is None or name in startup:
                    continue
                spec = getattr(mod, "__spec__", None)
                origin = getattr(spec, "origin", None)
                if origin in ("built-in", "frozen"):
                    names.append(name)
                    continue
                if not isinstance(origin, str) or not getattr(spec, "has_location", False):
                    continue
                d = os.path.dirname(origin)
                if spec.submodule_search_locations is not None:
                    d = os.path.dirname(d)
                if d in own_dirs and d not in excluded:
                    names.append(name)
            data = ",".join(names).encode()[:len(page) - 4]
            page[4:4 + len(data)] = data
            page[:4] = len(data).to_bytes(4, "little")
        except BaseException:
            pass

    signal.signal(signal.SIGCHLD, reap)

    def install(prog):
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return -ctypes.get_errno()
        buf = ctypes.create_string_buffer(prog, len(prog))
        fprog = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
        # SECCOMP_SET_MODE_FILTER, NEW_LISTENER | WAIT_KILLABLE_RECV (then without the latter).
        for flags in ((1 << 3) | (1 << 5), 1 << 3):
            r = libc.syscall(ctypes.c_long(nr_seccomp), ctypes.c_long(1), ctypes.c_long(flags),
                             ctypes.byref(fprog))
            if r >= 0:
                return r
        return -ctypes.get_errno()

    class MmMap(ctypes.Structure):  # struct prctl_mm_map
        _fields_ = [(n, ctypes.c_uint64) for n in (
            "start_code", "end_code", "start_data", "end_data", "start_brk", "brk",
            "start_stack", "arg_start", "arg_end", "env_start", "env_end", "auxv")] + [
            ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]

    libc.malloc.restype = ctypes.c_void_p
    libc.sbrk.restype = ctypes.c_void_p

    def own_stat():
        # /proc/self/stat's fields from the fourth on; those show_argv takes stay as they are.
        f = open("/proc/self/stat", "rb").read()
        return [int(x) for x in f[f.rindex(b")") + 2:].split()[1:]]

    def show_argv(argv, stat):
        # /proc/self/cmdline (ps) as exec would show it: PR_SET_MM_MAP with the arguments in a
        # block of ours (never freed), every other field as it is; unprivileged when exe_fd
        # is left alone. Where the kernel refuses, the zygote's stays (said in the crate doc).
        blob = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
        field = lambda n: stat[n - 4]  # proc(5)'s numbering; stat starts at field 4
        addr = libc.malloc(len(blob))
        if not addr:
            return
        ctypes.memmove(addr, blob, len(blob))
        m = MmMap(field(26), field(27), field(45), field(46), field(47), libc.sbrk(0),
                  field(28), addr, addr + len(blob), field(50), field(51), 0, 0, 0xFFFFFFFF)
        libc.prctl(35, 14, ctypes.byref(m), ctypes.sizeof(m), 0)  # PR_SET_MM, PR_SET_MM_MAP

    def default_signals():
        # As exec leaves a process that ignores nothing, then the interpreter's own start-up:
        # SIGPIPE and SIGXFSZ ignored, ^C a KeyboardInterrupt. Done ahead of the request.
        for s in signal.valid_signals():
            if s in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # the C library's own (glibc's 32 and 33)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def take_limits_and_signals(req):
        # What exec would have left the proc: the client's limits, its ignored signals
        # ignored and every other disposition the default, its mask; then the interpreter's
        # own start-up (SIGPIPE and SIGXFSZ ignored, ^C a KeyboardInterrupt unless ignored).
        for r, soft, hard in req.get("rlimits", []):
            if jail is not None and r == resource.RLIMIT_NPROC:
                continue  # the jail's own (its pids limit), as a cold jail sets it
            want = tuple(resource.RLIM_INFINITY if v == (1 << 64) - 1 else v for v in (soft, hard))
            try:
                if resource.getrlimit(r) != want:
                    resource.setrlimit(r, want)
            except (OSError, ValueError) as e:
                return "setting limit %d to %s: %s" % (r, want, e)
        # Every disposition was made the default's (and the interpreter's) ahead, by
        # default_signals: only what the client ignores is left.
        for s in req.get("ignored", []):
            if s not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(s, signal.SIG_IGN)
                except (OSError, ValueError):
                    pass  # the C library's own (glibc's 32 and 33)
        signal.pthread_sigmask(signal.SIG_SETMASK, req.get("blocked", []))
        return None

    def stdio(fd, mode, name, old):
        raw = io.FileIO(fd, mode + "b", closefd=False)
        raw.name = name
        # As the interpreter makes them at start-up (PYTHONUNBUFFERED, -u: writes unbuffered).
        unbuffered = mode == "w" and old.write_through
        if unbuffered:
            buf = raw
        else:
            buf = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        line = mode == "w" and not unbuffered and (raw.isatty() or fd == 2)
        t = io.TextIOWrapper(buf, encoding=old.encoding, errors=old.errors, newline="\n",
                             line_buffering=line, write_through=unbuffered)
        t.mode = mode
        return t

    timeline = os.environ.get("SIGMA_SUPERVISE_TIMELINE")

    def mark(fd, label):
        # As the supervisor's own marks (jail::mark), on the client's stderr.
        if timeline:
            t = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            os.write(fd, b"timeline %d %s %d\n" % (os.getpid(), label, t))

    class Ready:
        """A proc forked ahead of its request, with its σcontainer made as far as a request
        leaves it unchanged (`_Jail.prepare`): it waits on `sock` for the request the zygote
        read, so a run pays neither the fork nor most of its jail."""

        def __init__(self):
            # The page a learning proc writes its imports to: made before the fork, shared.
            self.page = mmap.mmap(-1, 4096)
            self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
            try:
                pid, init = jail.fork(os.fork) if jail is not None else (os.fork(), None)
            except OSError:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
                self.drop()
                theirs.close()
                raise
            if pid == 0:
                self.sock.close()
                waiting(theirs, self.page, init)  # never returns
            self.pid = pid
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            theirs.close()

        def hand_over(self, hand, conn):
            # The client's connection, which the proc reads its request from itself; Err: the
            # ready proc is gone (killed; its namespaces' init is ended on its reaping). Its
            # report pipe comes back on `sock` ([`taken`]).
            socket.send_fds(self.sock, [hand], [conn])

        def drop(self):
            self.sock.close()  # it ends, unasked
            self.page.close()

    def waiting(sock, page, init):
        # A ready proc: its σcontainer prepared, then its request awaited. A preparation that
        # failed is said to the client the request comes from.
        signal.set_wakeup_fd(-1)  # the zygote's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # the zygote's end is its own, while it waits
        # Nothing of the zygote's or of running procs' is held while it waits.
        keep = sorted({sock.fileno()} | ({init} if init is not None else set()))
        last = 2
        for fd in keep:
            os.closerange(last + 1, fd)
            last = fd
        os.closerange(last + 1, 1 << 20)
        failed = None
        if jail is not None:
            try:
                jail.prepare(init)
            except OSError as e:
                failed = e
            os.close(init)
        default_signals()
        stat = own_stat()
        for name, reseed in RESEED.items():
            if name in sys.modules:
                reseed(sys.modules[name])  # its own entropy, drawn ahead
        try:
            msg, fds = _recv_fds(sock, 1 << 16, 1)
        except BaseException:  # an error, or ^C meant for the pool
            os._exit(125)
        if not fds:
            os._exit(0)  # the zygote retired it
        # The request, from its client: stdio, the report pipe, its descriptors and its trees.
        conn = socket.socket(fileno=fds[0])
        conn.settimeout(2)  # a client that stalls is given up after two seconds
        try:
            hand = json.loads(msg)
            msg, fds = _recv_fds(conn, 1 << 20, 64)
            req = json.loads(msg)
            # A jailed zygote forks only jailed procs, each with its trees after its fds.
            trees = len(req["jail"]["binds"]) if jail is not None else 0
            if (req.get("jail") is None) != (jail is None) or not isinstance(hand, dict):
                raise ValueError
            if len(fds) != 4 + len(req["fds"]) + trees:
                raise ValueError
            # The report pipe, to the zygote that reaps the proc and says how it ended.
            socket.send_fds(sock, [b"taken"], [fds[3]])
        except BaseException:
            os._exit(0)  # its client sees the connection close, and starts cold
        conn.settimeout(None)
        sock.close()
        libc.prctl(1, 0, 0, 0, 0)  # from here a proc as a forked one is
        mark(fds[2], b"taken")
        if failed is None and jail is not None:
            try:
                jail.complete(req["jail"], fds[4 + len(req["fds"]):])
                mark(fds[2], b"jail-completed")
            except (OSError, KeyError, ValueError, TypeError) as e:
                failed = e
        if failed is not None:
            conn.send(json.dumps({"error": "completing the proc's σcontainer: %s" % failed}).encode())
            os._exit(125)
        child(conn, req, fds, hand, page if hand.get("learn") else None, stat)

    def child(conn, req, fds, hand, page, stat):
        for other in pages.values():
            other.close()  # siblings' pages are theirs
        sys.stdout.flush()
        sys.stderr.flush()
        for i in range(3):
            os.dup2(fds[i], i)
        if jail is not None and not any(os.isatty(i) for i in range(3)):
            os.setsid()  # as a cold jail's target: a session of its own without a terminal
        # The inherited descriptors at their numbers: first all out of the way, then placed.
        cfd = conn.fileno()
        above = max(req["fds"], default=2) + 1
        if cfd in req["fds"]:
            conn = socket.socket(fileno=fcntl.fcntl(cfd, fcntl.F_DUPFD_CLOEXEC, above))
            cfd = conn.fileno()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds[4:]]
        for fd, n in zip(high, req["fds"]):
            os.dup2(fd, n, inheritable=True)
        keep_fds = sorted(set(req["fds"]) | {cfd})
        last = 2
        for fd in keep_fds:
            os.closerange(last + 1, fd)
            last = fd
        os.closerange(last + 1, 1 << 20)
        sys.stdin = sys.__stdin__ = stdio(0, "r", "<stdin>", sys.__stdin__)
        sys.stdout = sys.__stdout__ = stdio(1, "w", "<stdout>", sys.__stdout__)
        sys.stderr = sys.__stderr__ = stdio(2, "w", "<stderr>", sys.__stderr__)
        argv = [os.fsdecode(bytes.fromhex(a)) for a in req["argv"]]
        failed = take_limits_and_signals(req)
        if failed:
            conn.send(json.dumps({"error": failed}).encode())
            os._exit(125)
        show_argv(argv, stat)
        pidfd = os.pidfd_open(os.getpid())
        listener = install(bytes.fromhex(req["filter"]))
        if listener < 0:
            conn.send(json.dumps({"error": "installing the seccomp filter", "errno": -listener}).encode())
            os._exit(125)
        mark(2, b"filter")
        socket.send_fds(conn, [json.dumps({"pid": os.getpid()}).encode()], [pidfd, listener])
        os.close(listener)
        os.close(pidfd)
        conn.settimeout(None)
        if conn.recv(1) != b"g":
            os._exit(125)
        if req.get("stats"):
            said_at_end.append(conn)  # its unique memory, said as it ends (leave)
        else:
            conn.close()
        # The identity: umask, cwd, environ, argv, sys.path[0]; fresh random state.
        os.umask(req["umask"])
        # A jailed proc starts where its cold jail would (the working directory, or / when it
        # is not shown).
        cwd = (req["jail"].get("workdir") or "2f") if jail is not None else req["cwd"]
        os.chdir(os.fsdecode(bytes.fromhex(cwd)))
        env = [bytes.fromhex(kv).partition(b"=")[::2] for kv in req["env"]]
        if [k for k, _ in env] == list(os.environb):
            # The same names in the same order (a run from the pool's own environment): only
            # the values that differ are set, each where it is (a rebuild would copy pages).
            for k, v in env:
                if os.environb[k] != v:
                    os.environb[k] = v
        else:
            os.environb.clear()
            for k, v in env:
                os.environb[k] = v
        sys.orig_argv = argv
        for name in [m for m in sys.modules if m not in keep]:
            del sys.modules[name]
        main = sys.modules["__main__"]
        g = main.__dict__
        g.clear()
        g.update(base_main)
        module = None
        if argv[1] == "-c":
            sys.argv = ["-c"] + argv[3:]
            code = compile(argv[2], "<string>", "exec", dont_inherit=True)
        elif argv[1] == "-m":
            # As `python3 -m MODULE` runs it: sys.path[0] the working directory, runpy finding
            # the module, making it __main__ and its file sys.argv[0].
            module, code = argv[2], None
            sys.argv = ["-m"] + argv[3:]
            sys.path[0] = os.getcwd()
        else:
            sys.argv = argv[1:]
            # As the interpreter names it (3.9+): __file__ and tracebacks say the absolute path.
            script = os.path.abspath(argv[1])
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            with open(script, "rb") as f:
                source = f.read()
            loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", script)
            g.update(__file__=script, __cached__=None, __loader__=loader)
            code = compile(source, script, "exec", dont_inherit=True)
        excluded = {os.path.abspath(sys.path[0] or "."), os.path.abspath(".")}
        imports = hand.get("imports", [])
        gc.enable()
        mark(2, b"run")
        try:
            try:
                if module is not None:
                    __import__("runpy")._run_module_as_main(module, alter_argv=True)
                else:
                    exec(code, g)
            finally:
                if page is not None:
                    record(page, imports, excluded)
        except SystemExit as e:
            leave(exit_status(e))
        except BaseException as e:
            # Reported as the interpreter reports it, without this frame.
            e.__traceback__ = e.__traceback__.tb_next
            sys.excepthook(type(e), e, e.__traceback__)
            if isinstance(e, KeyboardInterrupt):
                # As CPython ends on an unhandled ^C: finalised (threads joined, atexit run,
                # output flushed), then killed by SIGINT, so its parent sees the signal.
                if "threading" in sys.modules:
                    sys.modules["threading"]._shutdown()
                __import__("atexit")._run_exitfuncs()
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except (OSError, ValueError):
                        pass
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
                os.kill(os.getpid(), signal.SIGINT)
            leave(1)
        leave(0)

    said_at_end = []

    def exit_status(e):
        # As the interpreter maps a SystemExit that ends it.
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code & 0xFF
        try:
            print(e.code, file=sys.stderr)
        except BaseException:
            pass
        return 1

    def leave(status):
        # As the interpreter ends, without tearing down the heap the proc shares with its
        # zygote (finalising it would touch, and so copy, every page of it): threads joined,
        # atexit run, every file the program left open flushed (as their finalisation would),
        # stdout and stderr flushed (120 if one cannot be); then _exit.
        try:
            if "threading" in sys.modules:
                sys.modules["threading"]._shutdown()
            __import__("atexit")._run_exitfuncs()
            buffered = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
            for o in gc.get_objects():  # the program's own: the zygote's heap is frozen
                if isinstance(o, buffered) and o not in (sys.stdout, sys.stderr):
                    try:
                        o.flush()
                    except BaseException:
                        pass
        except BaseException:
            pass
        for f in (sys.stdout, sys.stderr):
            # As the interpreter's end: a closed one is left alone, one that cannot be flushed
            # makes the status 120.
            try:
                if not f.closed:
                    f.flush()
            except BaseException:
                status = 120
        for conn in said_at_end:
            # --stats: the memory of its own (private pages), the rest shared with its zygote.
            try:
                kib = 0
                with open("/proc/self/smaps_rollup", "rb") as f:
                    for line in f:
                        if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                            kib += int(line.split()[1])
                conn.send(json.dumps({"unique_kib": kib}).encode())
            except BaseException:
                pass
        os._exit(status)

    if threading.active_count() != 1:
        print("zygote: a preload started a thread; not forking", file=sys.stderr)
        os._exit(3)
    if jail is not None:
        jail.ask(2)  # two procs' namespaces made ahead
    gc.collect()
    gc.freeze()
    try:
        ready = Ready()  # the first proc, made ready before the zygote is
    except OSError:
        ready = None
    ctl.send(b"ready")
    import select

    # A proc's end wakes the loop below (SIGCHLD, through this pipe), which may then make the
    # next proc ready.
    woken, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    AHEAD = 0.05  # seconds after a hand-over, when its proc still runs, to make the next ready
    last, handed_at, retry_at = None, 0.0, 0.0

    def taken_by(pid, wait=False):
        # A pending proc's word that it took its request, with its client's report pipe; EOF
        # when it gave the request up (or ended) first. SIGCHLD is blocked meanwhile.
        r, learn = pending[pid]
        try:
            _, got = _recv_fds(r.sock, 16, 1, 0 if wait else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            got = []
        del pending[pid]
        r.sock.close()
        if not got:
            r.page.close()
            early.pop(pid, None)
            return
        ended[pid] = got[0]
        if learn:
            pages[pid] = r.page
        else:
            r.page.close()
        if pid in early:
            finish(pid, early.pop(pid))

    def client_gone(timeout):
        # A proc does not outlive its client (its supervisor): the read end of the report
        # pipe closes with the client, and the write end we hold then polls POLLERR.
        watch = select.poll()
        watch.register(ctl, select.POLLIN)
        watch.register(woken, select.POLLIN)
        asked = {r.sock.fileno(): pid for pid, (r, _) in list(pending.items())}
        for fd in asked:
            watch.register(fd, select.POLLIN)
        # A copy made in one call: reap (a signal handler) may change `ended` between two
        # steps of Python code.
        by_fd = {fd: pid for pid, fd in list(ended.items())}
        for fd in by_fd:
            watch.register(fd, 0)
        try:
            polled = watch.poll(timeout)
        except InterruptedError:
            return
        for fd, ev in polled:
            pid = by_fd.get(fd)
            if fd in asked:
                signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
                taken_by(asked[fd])
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            elif fd == woken:
                try:
                    os.read(woken, 512)
                except OSError:
                    pass
            elif pid is not None and ev & (select.POLLERR | select.POLLHUP):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                if jail is not None:
                    jail.ended(pid)  # and what it left running

    while True:
        # The next proc is made ready once the last one handed over has ended, or has run
        # AHEAD seconds: not while it starts, which a fork beside it would slow down.
        now = time.monotonic()
        running = last in ended or last in pending
        due = max(retry_at, handed_at + AHEAD if running else now)
        if ready is None and now >= due:
            try:
                ready = Ready()
            except OSError:
                retry_at = due = now + AHEAD
        timeout = None if ready is not None else max(1, int((due - now) * 1000) + 1)
        client_gone(timeout)
        try:
            said, fds = _recv_fds(ctl, 1 << 16, 1, socket.MSG_DONTWAIT)
        except (InterruptedError, BlockingIOError):
            continue
        try:
            hand = json.loads(said) if fds else {}
        except ValueError:
            hand = {}
        if not fds:
            # The pool retired this zygote (or is gone): no more forks; the procs it has end
            # as they would, and each one's client still hears how.
            if ready is not None:
                ready.drop()
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
            for pid in list(pending):
                taken_by(pid, wait=True)
            reap()
            while ended:
                signal.sigwait([signal.SIGCHLD])
                reap()
            os._exit(0)
        h = json.dumps(hand).encode()
        pid = -1
        # Its end is not reaped before it is known as taken or pending.
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        for again in (False, True):
            try:
                if ready is None:
                    ready = Ready()
                    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
                taken, ready = ready, None
                taken.hand_over(h, fds[0])
                pid = taken.pid
                break
            except OSError as e:
                if again:
                    try:
                        msg = json.dumps({"error": "forking the proc: %s" % e}).encode()
                        os.write(fds[0], msg)
                    except OSError:
                        pass
        os.close(fds[0])
        if pid > 0:
            pending[pid] = (taken, bool(hand.get("learn")))
            last, handed_at = pid, time.monotonic()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])


_zygote()
