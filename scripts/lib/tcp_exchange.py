"""The decentralized exchange's traffic over plain TCP: a baseline for scripts/bench-wan.

Each of n nodes serves `size` bytes to each of the others and fetches theirs, all at once (the
pattern of a decentralized round: every link carries data both ways), from plain sockets in the
nodes' network namespaces. With `rate` (bytes/s) a node's sends share one schedule at that rate,
in 16 KiB writes, as shoal-peer's --serve-pacing does; without it they go as fast as TCP takes
them. run() returns the time until the last node holds every other's bytes.

Run as a script, it is one node: python3 tcp_exchange.py INDEX ADDRS PORT SIZE START RATE
(ADDRS: the nodes' addresses, comma-separated; START: the wall-clock time to start fetching).
It prints its seconds from START to its last fetch's end, and serves until its stdin closes.
"""

import socket
import subprocess
import sys
import threading
import time

PIECE = 16 << 10


def _node(index, addresses, port, size, start, rate):
    payload = b"\0" * size
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((addresses[index], port))
    listener.listen(len(addresses))
    lock = threading.Lock()
    free_at = [0.0]

    def serve(conn):
        with conn:
            conn.recv(1)
            sent = 0
            while sent < size:
                n = min(PIECE if rate else size, size - sent)
                if rate:
                    with lock:
                        now = time.time()
                        at = max(now, free_at[0])
                        free_at[0] = at + n / rate
                    if at > now:
                        time.sleep(at - now)
                conn.sendall(payload[sent:sent + n])
                sent += n

    def accept():
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    done = []

    def fetch(peer):
        with socket.create_connection((addresses[peer], port)) as s:
            s.sendall(b"g")
            got = 0
            while got < size:
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise RuntimeError(f"node {peer} closed after {got} of {size} bytes")
                got += len(chunk)
        done.append(time.time())

    while time.time() < start:
        time.sleep(0.001)
    fetches = [threading.Thread(target=fetch, args=(p,))
               for p in range(len(addresses)) if p != index]
    for t in fetches:
        t.start()
    for t in fetches:
        t.join()
    print(f"{max(done) - start:.3f}", flush=True)
    sys.stdin.read()  # serve the others until the driver closes stdin


def run(bed, nodes, size, rate=0, port=9500):
    """The exchange between `nodes` (names in the shoal_testbed.Testbed `bed`): seconds until
    the last node holds every other's `size` bytes, sent unpaced (rate 0) or at `rate` bytes/s
    per node."""
    addresses = [bed.nodes[n][1] for n in nodes]
    start = time.time() + 1.0
    procs = [subprocess.Popen(
        ["ip", "netns", "exec", bed.nodes[n][0], sys.executable, __file__, str(i),
         ",".join(addresses), str(port), str(size), repr(start), repr(rate)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i, n in enumerate(nodes)]
    try:
        times = [float(p.stdout.readline() or "nan") for p in procs]
        if any(t != t for t in times):
            return float("nan")
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    return max(times)


if __name__ == "__main__":
    _node(int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]),
          float(sys.argv[5]), float(sys.argv[6]))
