"""A gRPC server for the tests (grpcio, messages as raw bytes: no generated code).

`peer.py [ADDR] [--tls CERT KEY]` (ADDR default 127.0.0.1:0; with `--tls`, gRPC over TLS with
that PEM certificate and key, ALPN h2). Prints `listening on 127.0.0.1:PORT` once it serves,
then serves until killed.

Methods (service `test.Echo`), each answering with initial metadata `x-seen-method`,
`x-peer` (`127.0.0.1:PORT`, which server answered),
`x-seen-timeout-ms` (the time left, when the call had a deadline) and echoing
every request metadata `x-echo-*` back; trailers `x-trailer: yes`, `x-usage-tokens` (the
request's `x-usage` metadata) and, with request metadata `x-status: CODE`, that status and
`x-message` as its details:
- `Unary`: the request message back.
- `ServerStream`: `x-count` messages (default 3) `0`, `1`, ..., `x-interval-ms` apart.
- `ClientStream`: the number of messages read, as text.
- `Bidi`: each message back as it comes.
- `Slow`: waits `x-sleep-ms` (or until the call is cancelled), then the request back.
`test.Control/SetHealth` sets the health service's status of the service its message names
(`SERVICE=STATUS`; empty service: the server's).
"""

import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def meta(context):
    return dict(context.invocation_metadata())


PEER = {"addr": ""}


def start(context):
    m = meta(context)
    initial = [("x-seen-method", "yes"), ("x-peer", PEER["addr"])]
    remaining = context.time_remaining()
    if remaining is not None and remaining < 1e6:
        initial.append(("x-seen-timeout-ms", str(int(remaining * 1000))))
    for k, v in m.items():
        if k.startswith("x-echo-"):
            initial.append((k, v))
    context.send_initial_metadata(initial)
    return m


def finish(context, m):
    trailers = [("x-trailer", "yes")]
    if "x-usage" in m:
        trailers.append(("x-usage-tokens", m["x-usage"]))
    context.set_trailing_metadata(trailers)
    if "x-status" in m:
        context.set_code(next(c for c in grpc.StatusCode if c.value[0] == int(m["x-status"])))
        context.set_details(m.get("x-message", ""))


def unary(request, context):
    m = start(context)
    finish(context, m)
    return request


def server_stream(request, context):
    m = start(context)
    interval = int(m.get("x-interval-ms", "0")) / 1000
    for i in range(int(m.get("x-count", "3"))):
        if i and interval:
            time.sleep(interval)
        yield str(i).encode()
    finish(context, m)


def client_stream(request_iterator, context):
    m = start(context)
    n = sum(1 for _ in request_iterator)
    finish(context, m)
    return str(n).encode()


def bidi(request_iterator, context):
    m = start(context)
    for msg in request_iterator:
        yield msg
    finish(context, m)


def slow(request, context):
    m = start(context)
    done = threading.Event()
    context.add_callback(done.set)
    done.wait(int(m.get("x-sleep-ms", "0")) / 1000)
    finish(context, m)
    return request


def main():
    args = sys.argv[1:]
    tls = None
    if "--tls" in args:
        i = args.index("--tls")
        tls = args[i + 1:i + 3]
        del args[i:i + 3]
    addr = args[0] if args else "127.0.0.1:0"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    h = health.HealthServicer()
    h.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(h, server)

    def set_health(request, context):
        service, _, status = request.decode().partition("=")
        h.set(service, health_pb2.HealthCheckResponse.ServingStatus.Value(status))
        return b"ok"

    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("test.Echo", {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
            "Slow": grpc.unary_unary_rpc_method_handler(slow),
        }),
        grpc.method_handlers_generic_handler("test.Control", {
            "SetHealth": grpc.unary_unary_rpc_method_handler(set_health),
        }),
    ))
    if tls:
        with open(tls[0], "rb") as cert, open(tls[1], "rb") as key:
            creds = grpc.ssl_server_credentials([(key.read(), cert.read())])
        port = server.add_secure_port(addr, creds)
    else:
        port = server.add_insecure_port(addr)
    PEER["addr"] = f"127.0.0.1:{port}"
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
