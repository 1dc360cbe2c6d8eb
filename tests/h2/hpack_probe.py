"""Asks a gateway over h2c (prior knowledge) for PATH, N times on one connection, with the
python-hyper `h2` client, and prints each answer's header fields as HPACK sent them:
`[[[name, value, never_indexed], ...], ...]` (never_indexed: the field came as a never-indexed
literal, RFC 7541 6.2.3, which `hpack` decodes as a NeverIndexedHeaderTuple).

    hpack_probe.py HOST:PORT PATH N '[["x-org-id", "acme"]]'
"""
import json
import socket
import sys

import h2.config
import h2.connection
import h2.events
from hpack import NeverIndexedHeaderTuple

addr, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
extra = [tuple(h) for h in json.loads(sys.argv[4])] if len(sys.argv) > 4 else []
host, port = addr.rsplit(":", 1)
sock = socket.create_connection((host, int(port)), timeout=10)
conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
conn.initiate_connection()
sock.sendall(conn.data_to_send())
answers = []
for _ in range(n):
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                            (":authority", addr)] + extra, end_stream=True)
    sock.sendall(conn.data_to_send())
    fields, ended = None, False
    while not ended:
        data = sock.recv(65536)
        if not data:
            sys.exit("the gateway closed the connection")
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                fields = [[bytes(f[0]).decode(), bytes(f[1]).decode(),
                           isinstance(f, NeverIndexedHeaderTuple)] for f in ev.headers]
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                ended = True
            elif isinstance(ev, h2.events.StreamReset):
                sys.exit("stream reset: %s" % ev)
        sock.sendall(conn.data_to_send())
    answers.append(fields)
print(json.dumps(answers))
