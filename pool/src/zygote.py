# The zygote: `python3 -c "exec(<this, read from stdin>)" CTL_FD PRELOADS`, started by the pool.
# It imports PRELOADS (comma-separated), freezes the heap, says "ready" on CTL_FD, then for each
# client connection the pool passes it: reads the client's request (identity, the compiled
# filter, stdio and the report pipe), forks, and in the child installs the proc's filter with
# its own listener, hands pidfd + listener to the client, waits for "go", takes the identity
# and runs the program as `python3 script.py` / `python3 -c CODE` would. The parent reaps the
# child and writes how it ended to the client's report pipe (jail::init::Ended's two bytes).
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


def _zygote():
    # Locals, not globals: the child empties __main__'s namespace for the program.
    import sys
    base_main = _BASE_MAIN
    ctl_fd = int(sys.argv[1])
    preloads = [p for p in sys.argv[2].split(",") if p]
    import _thread
    startup = {m.partition(".")[0] for m in sys.modules}
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
    import os, gc, json, signal, socket, ctypes, threading, io, fcntl, resource, mmap
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

    def reap(*_):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = ended.pop(pid, None)
            if fd is None:
                continue
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                report = bytes([(128 + sig) & 0xFF, sig])
            else:
                report = bytes([os.WEXITSTATUS(status) & 0xFF, 0])
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

    def show_argv(argv):
        # /proc/self/cmdline (ps) as exec would show it: PR_SET_MM_MAP with the arguments in a
        # block of ours (never freed), every other field as it is; unprivileged when exe_fd
        # is left alone. Where the kernel refuses, the zygote's stays (said in the crate doc).
        blob = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
        f = open("/proc/self/stat", "rb").read()
        f = [int(x) for x in f[f.rindex(b")") + 2:].split()[1:]]
        field = lambda n: f[n - 4]  # proc(5)'s numbering; f starts at field 4
        addr = libc.malloc(len(blob))
        if not addr:
            return
        ctypes.memmove(addr, blob, len(blob))
        m = MmMap(field(26), field(27), field(45), field(46), field(47), libc.sbrk(0),
                  field(28), addr, addr + len(blob), field(50), field(51), 0, 0, 0xFFFFFFFF)
        libc.prctl(35, 14, ctypes.byref(m), ctypes.sizeof(m), 0)  # PR_SET_MM, PR_SET_MM_MAP

    def take_limits_and_signals(req):
        # What exec would have left the proc: the client's limits, its ignored signals
        # ignored and every other disposition the default, its mask; then the interpreter's
        # own start-up (SIGPIPE and SIGXFSZ ignored, ^C a KeyboardInterrupt unless ignored).
        for r, soft, hard in req.get("rlimits", []):
            want = tuple(resource.RLIM_INFINITY if v == (1 << 64) - 1 else v for v in (soft, hard))
            try:
                if resource.getrlimit(r) != want:
                    resource.setrlimit(r, want)
            except (OSError, ValueError) as e:
                return "setting limit %d to %s: %s" % (r, want, e)
        ignored = set(req.get("ignored", []))
        for s in signal.valid_signals():
            if s in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # the C library's own (glibc's 32 and 33)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if signal.SIGINT not in ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
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

    def child(conn, req, fds, hand, page):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for other in pages.values():
            other.close()  # siblings' pages are theirs
        sys.stdout.flush()
        sys.stderr.flush()
        for i in range(3):
            os.dup2(fds[i], i)
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
        show_argv(argv)
        pidfd = os.pidfd_open(os.getpid())
        listener = install(bytes.fromhex(req["filter"]))
        if listener < 0:
            conn.send(json.dumps({"error": "installing the seccomp filter", "errno": -listener}).encode())
            os._exit(125)
        socket.send_fds(conn, [json.dumps({"pid": os.getpid()}).encode()], [pidfd, listener])
        os.close(listener)
        os.close(pidfd)
        conn.settimeout(None)
        if conn.recv(1) != b"g":
            os._exit(125)
        conn.close()
        # The identity: umask, cwd, environ, argv, sys.path[0]; fresh random state.
        os.umask(req["umask"])
        os.chdir(os.fsdecode(bytes.fromhex(req["cwd"])))
        os.environb.clear()
        for kv in req["env"]:
            k, _, v = bytes.fromhex(kv).partition(b"=")
            os.environb[k] = v
        sys.orig_argv = argv
        for name in [m for m in sys.modules if m not in keep]:
            del sys.modules[name]
        for name, reseed in RESEED.items():
            if name in sys.modules:
                reseed(sys.modules[name])
        main = sys.modules["__main__"]
        g = main.__dict__
        g.clear()
        g.update(base_main)
        if argv[1] == "-c":
            sys.argv = ["-c"] + argv[3:]
            code = compile(argv[2], "<string>", "exec", dont_inherit=True)
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
        try:
            try:
                exec(code, g)
            finally:
                if page is not None:
                    record(page, imports, excluded)
        except SystemExit:
            raise
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
            raise SystemExit(1)
        raise SystemExit(0)

    if threading.active_count() != 1:
        print("zygote: a preload started a thread; not forking", file=sys.stderr)
        os._exit(3)
    gc.collect()
    gc.freeze()
    ctl.send(b"ready")
    while True:
        try:
            said, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 1)
        except InterruptedError:
            continue
        try:
            hand = json.loads(said) if fds else {}
        except ValueError:
            hand = {}
        if not fds:
            # The pool retired this zygote (or is gone): no more forks; the procs it has end
            # as they would, and each one's client still hears how.
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
            reap()
            while ended:
                signal.sigwait([signal.SIGCHLD])
                reap()
            os._exit(0)
        conn = socket.socket(fileno=fds[0])
        conn.settimeout(2)  # a client that stalls holds this zygote up two seconds at most
        try:
            msg, cfds, _, _ = socket.recv_fds(conn, 1 << 20, 16)
            req = json.loads(msg)
        except (OSError, ValueError):
            msg, cfds, req = b"", [], {}
        if not msg or len(cfds) != 4 + len(req.get("fds", [])):
            for fd in cfds:
                os.close(fd)
            conn.close()
            continue
        page = mmap.mmap(-1, 4096) if hand.get("learn") else None
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        pid = os.fork()
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            child(conn, req, cfds, hand, page)
        ended[pid] = cfds[3]
        if page is not None:
            pages[pid] = page
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        for fd in cfds[:3]:
            os.close(fd)
        conn.close()


_zygote()
