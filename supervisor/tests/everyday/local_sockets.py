"""Local sockets: a unix-socket server and client, multiprocessing's Manager and forkserver,
socket pairs, an abstract name the program binds itself."""
import multiprocessing as mp
import os, socket, tempfile, threading


def square(x):
    return x * x


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)

        def serve():
            c, _ = srv.accept()
            c.sendall(c.recv(100).upper())
            c.close()

        t = threading.Thread(target=serve)
        t.start()
        cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        cli.connect(path)
        cli.sendall(b"over a unix socket")
        print("unix", cli.recv(100))
        t.join()
        cli.close()
        srv.close()
        os.unlink(path)
    name = b"\0sigma-everyday-" + str(os.getpid()).encode()
    a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    a.bind(name)
    a.listen(1)
    b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    b.connect(name)
    c, _ = a.accept()
    b.sendall(b"abstract")
    print("abstract", c.recv(8))
    with mp.Manager() as m:
        d = m.dict()
        lst = m.list(range(3))
        d["k"] = "v"
        print("manager", dict(d), list(lst))
    ctx = mp.get_context("forkserver")
    with ctx.Pool(2) as pool:
        print("forkserver", pool.map(square, range(4)))
    x, y = socket.socketpair()
    x.sendall(b"pair")
    print("socketpair", y.recv(4))
