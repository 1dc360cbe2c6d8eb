#!/usr/bin/env python3
"""Refusals under the limit: the load shapes of the fleet issue, against running gateways.

    under-limit.py bursts PORT[,PORT...]          4 bursts of 60 concurrent requests, 1.5 s
                                                  apart, each on the next instance in turn
    under-limit.py even PORT[,PORT...]            240 requests at 30 per second, round robin
    under-limit.py proxy LISTEN TARGET DELAY_MS   a TCP proxy that delays every chunk DELAY_MS
                                                  each way (Redis "DELAY_MS away")

The load commands send tenant `acme` to `/x`, print `offered=N refused=K statuses=...` and
exit 0; the rule under test is 300 per 10 s, so 240 requests are 0.8 of the limit.
"""
import asyncio
import http.client
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def request(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/x", headers={"x-org-id": "acme"})
        status = c.getresponse().status
        c.close()
        return status
    except OSError:
        return 0


def bursts(ports):
    statuses = []
    with ThreadPoolExecutor(60) as pool:
        for burst in range(4):
            port = ports[burst % len(ports)]
            statuses += list(pool.map(request, [port] * 60))
            time.sleep(1.5)
    return statuses


def even(ports):
    statuses = []
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        futures = []
        for i in range(240):
            # paced: request i leaves at i / 30 s
            delay = start + i / 30 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(request, ports[i % len(ports)]))
        statuses = [f.result() for f in futures]
    return statuses


async def proxy(listen, target, delay_ms):
    delay = delay_ms / 1000

    async def pipe(reader, writer):
        queue = asyncio.Queue()

        async def send():
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + delay, data))
        except OSError:
            pass
        queue.put_nowait((0, None))
        await sender

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pipe(client_reader, server_writer),
            pipe(server_reader, client_writer),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def main():
    if sys.argv[1] == "proxy":
        asyncio.run(proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
        return
    ports = [int(p) for p in sys.argv[2].split(",")]
    statuses = {"bursts": bursts, "even": even}[sys.argv[1]](ports)
    refused = sum(1 for s in statuses if s != 200)
    counts = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    print(f"offered={len(statuses)} refused={refused} statuses={counts}")


if __name__ == "__main__":
    main()
