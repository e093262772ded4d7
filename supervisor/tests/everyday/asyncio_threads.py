"""asyncio (subprocess, sockets, timeouts) and threads (pools, queues, timers)."""
import asyncio, concurrent.futures, queue, sys, threading


async def main():
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "print(6 * 7)",
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    print("asyncio subprocess", proc.returncode, out.strip())
    proc = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        await asyncio.wait_for(proc.wait(), 0.3)
    except asyncio.TimeoutError:
        proc.kill()
        print("asyncio timeout, killed", await proc.wait())
    r, w = await asyncio.open_unix_connection(sock=__import__("socket").socketpair()[0])
    w.close()
    q = asyncio.Queue()
    await asyncio.gather(*(q.put(i) for i in range(3)))
    print("asyncio queue", q.qsize())
    await asyncio.sleep(0.01)


asyncio.run(main())
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    print("threadpool", sorted(ex.map(lambda x: x + 1, range(5))))
with concurrent.futures.ProcessPoolExecutor(2) as ex:
    print("processpool", sorted(ex.map(abs, [-1, -2, 3])))
qq = queue.Queue()
t = threading.Timer(0.05, lambda: qq.put("timer"))
t.start()
print(qq.get(timeout=30))
