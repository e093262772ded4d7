"""TCP and UDP on localhost: an HTTP server and client, an asyncio echo server, a
multiprocessing manager over TCP, a UDP round trip (the proc's own network namespace)."""
import asyncio
import http.server
import socket
import threading
import urllib.request
from multiprocessing.managers import BaseManager


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_port}/path") as r:
    print("http", r.status, r.read().decode())
srv.shutdown()


async def echo(reader, writer):
    data = await reader.readline()
    writer.write(data.upper())
    await writer.drain()
    writer.close()


async def tcp_echo():
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping over tcp\n")
    await writer.drain()
    line = await reader.readline()
    writer.close()
    server.close()
    await server.wait_closed()
    return line.decode().strip()


print("asyncio", asyncio.run(tcp_echo()))

shared = {}


class Manager(BaseManager):
    pass


Manager.register("store", callable=lambda: shared)

if __name__ == "__main__":
    m = Manager(address=("127.0.0.1", 0), authkey=b"k")
    m.start()
    store = m.store()
    store.update({"a": 1, "b": 2})
    print("manager", sorted(store.items()), m.address[0])
    m.shutdown()

    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_DGRAM) as a, socket.socket(family, socket.SOCK_DGRAM) as b:
            a.bind((host, 0))
            b.sendto(b"datagram", a.getsockname()[:2])
            data, peer = a.recvfrom(64)
            a.sendto(data[::-1], peer)
            print("udp", family.name, b.recv(64).decode())
