"""A TCP forwarder standing for a managed Redis's one endpoint (scripts/bench-fleet-sizing's
failover run): listens on LISTEN and forwards every connection to the first of TARGETS; on
SIGUSR1 it moves to the next target and closes every connection it forwards, as a failover of
the service's primary does to its clients.

    switch_proxy.py LISTEN_PORT TARGET_PORT [TARGET_PORT ...]
"""

import asyncio
import signal
import sys


async def main():
    listen, targets = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
    state = {"at": 0}
    open_writers = set()

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def serve(creader, cwriter):
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", targets[state["at"]])
        except OSError:
            cwriter.close()
            return
        open_writers.update((cwriter, uwriter))
        await asyncio.gather(pipe(creader, uwriter), pipe(ureader, cwriter))
        open_writers.discard(cwriter)
        open_writers.discard(uwriter)

    def switch():
        state["at"] = min(state["at"] + 1, len(targets) - 1)
        for w in list(open_writers):
            w.close()
        open_writers.clear()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, switch)
    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


asyncio.run(main())
