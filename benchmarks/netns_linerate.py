"""TCP goodput between two network namespaces: the line rate that netns_bench.sh compares the collectives with.

    python benchmarks/netns_linerate.py recv ADDR PORT        # prints {"bytes": ..., "seconds": ..., ...}
    python benchmarks/netns_linerate.py send ADDR PORT SECONDS

The receiver accepts one connection and counts the payload bytes from the first byte to the sender's EOF, so the
figure is what a TCP stream delivers through the shaped veth (headers excluded, as in the collectives' byte counts).
The sender writes 1 MiB blocks for SECONDS and closes. Timing on the receiving side leaves out what the sender's
socket buffer still held when it stopped. netns_bench.sh runs one stream each way alone, then both at once (as the
collectives do), and keeps every result.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

BLOCK = 1 << 20
CONNECT_TRIES_S = 10.0


def receive(addr: str, port: int) -> dict:
    with socket.create_server((addr, port), reuse_port=False) as srv:
        srv.settimeout(60)
        conn, _ = srv.accept()
    with conn:
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        total, first = 0, None
        while True:
            n = conn.recv_into(view)
            if n == 0:
                break
            if first is None:
                first = time.perf_counter()  # the clock starts here, so this read's bytes are not counted
            else:
                total += n
        end = time.perf_counter()
    seconds = end - first if first is not None else 0.0
    return {"bytes": total, "seconds": seconds, "bytes_per_s": total / seconds if seconds else 0.0}


def send(addr: str, port: int, seconds: float) -> dict:
    deadline = time.monotonic() + CONNECT_TRIES_S
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    block = bytes(BLOCK)
    sent, start = 0, time.perf_counter()
    with sock:
        sock.settimeout(None)
        while time.perf_counter() - start < seconds:
            sock.sendall(block)
            sent += BLOCK
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver closes after counting: wait for it, so the stream has really ended
    return {"bytes": sent, "seconds": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("recv")
    r.add_argument("addr")
    r.add_argument("port", type=int)
    s = sub.add_parser("send")
    s.add_argument("addr")
    s.add_argument("port", type=int)
    s.add_argument("seconds", type=float)
    args = p.parse_args()
    out = receive(args.addr, args.port) if args.mode == "recv" else send(args.addr, args.port, args.seconds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
