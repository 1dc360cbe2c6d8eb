"""A gRPC client for the tests (grpcio, messages as raw bytes).

`client.py SPEC`: SPEC is JSON: {"target": "HOST:PORT", "ca": optional PEM file (TLS, name
`localhost`), "service_config": optional JSON text (retries), "calls": [{"method":
"/test.Echo/Unary", "kind": "unary" | "server_stream" | "client_stream" | "bidi", "messages":
["text", ...], "metadata": [["name", "value"], ...], "timeout": seconds, "repeat": N}]}.
Prints one JSON list: a result per call (per repeat): {"code": "OK", "value": 0, "details",
"initial": {...}, "trailing": {...}, "responses": ["text", ...], "ms": elapsed}.
"""

import json
import sys
import time

import grpc


def md(pairs):
    out = {}
    for k, v in pairs or ():
        out[k] = v.decode("latin-1") if isinstance(v, bytes) else v
    return out


def one(channel, c):
    kind = c.get("kind", "unary")
    msgs = [m.encode() for m in c.get("messages", ["hello"])]
    kw = {"metadata": [tuple(p) for p in c.get("metadata", [])] or None, "timeout": c.get("timeout")}
    t0 = time.monotonic()
    responses = []
    call = None
    try:
        if kind == "unary":
            r, call = channel.unary_unary(c["method"]).with_call(msgs[0], **kw)
            responses.append(r)
        elif kind == "client_stream":
            r, call = channel.stream_unary(c["method"]).with_call(iter(msgs), **kw)
            responses.append(r)
        elif kind == "server_stream":
            call = channel.unary_stream(c["method"])(msgs[0], **kw)
            responses.extend(call)
        else:
            call = channel.stream_stream(c["method"])(iter(msgs), **kw)
            responses.extend(call)
        code, details = call.code(), call.details()
    except grpc.RpcError as e:
        call = e
        code, details = e.code(), e.details()
    return {
        "code": code.name,
        "value": code.value[0],
        "details": details,
        "initial": md(call.initial_metadata()) if call is not None else {},
        "trailing": md(call.trailing_metadata()) if call is not None else {},
        "responses": [r.decode("latin-1") for r in responses],
        "ms": (time.monotonic() - t0) * 1000,
    }


def main():
    spec = json.loads(sys.argv[1])
    options = []
    if spec.get("service_config"):
        options += [("grpc.enable_retries", 1), ("grpc.service_config", spec["service_config"])]
    if spec.get("ca"):
        with open(spec["ca"], "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        options.append(("grpc.ssl_target_name_override", "localhost"))
        channel = grpc.secure_channel(spec["target"], creds, options=options)
    else:
        channel = grpc.insecure_channel(spec["target"], options=options)
    out = []
    with channel:
        for c in spec["calls"]:
            for _ in range(c.get("repeat", 1)):
                out.append(one(channel, c))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
