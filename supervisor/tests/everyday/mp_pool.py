"""multiprocessing: Pool, Queue, Lock, Value, Event, terminate(), the spawn context."""
import multiprocessing as mp
import time


def square(x):
    return x * x


def worker(q, lock, counter):
    for _ in range(100):
        with lock:
            counter.value += 1
    q.put("done")


def forever(ev):
    ev.set()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("pool", pool.map(square, range(10)))
        print("imap", sorted(pool.imap_unordered(square, range(5))))
    q, lock, counter = mp.Queue(), mp.Lock(), mp.Value("i", 0)
    ps = [mp.Process(target=worker, args=(q, lock, counter)) for _ in range(3)]
    for p in ps:
        p.start()
    print("queue", [q.get(timeout=30) for _ in ps])
    for p in ps:
        p.join()
    print("counter", counter.value, [p.exitcode for p in ps])
    ev = mp.Event()
    p = mp.Process(target=forever, args=(ev,))
    p.start()
    ev.wait(30)
    p.terminate()
    p.join(30)
    print("terminated", p.exitcode)
    p = mp.Process(target=forever, args=(mp.Event(),))
    p.start()
    p.kill()
    p.join(30)
    print("killed", p.exitcode)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        print("spawn", pool.apply(square, (7,)))
