"""A JWKS over HTTPS for tests/jwt.rs: serves DIR/jwks.json (read again at every request, so
that a test rotates keys by writing the file) at any path, with `Cache-Control: CACHE`, on
127.0.0.1 and PORT (a free one by default), with the certificate DIR/idp.pem (key DIR/idp.key). Prints
`listening on 127.0.0.1:PORT`, and appends a line to DIR/requests.log per request.

    jwks_server.py DIR CACHE [PORT]
"""

import http.server
import os
import ssl
import sys

DIR, CACHE = sys.argv[1], sys.argv[2]
PORT = int(sys.argv[3]) if len(sys.argv) > 3 else 0


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(os.path.join(DIR, "requests.log"), "a") as f:
            f.write("%s\n" % self.path)
        with open(os.path.join(DIR, "jwks.json"), "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("cache-control", CACHE)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer.allow_reuse_address = True
server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(os.path.join(DIR, "idp.pem"), os.path.join(DIR, "idp.key"))
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
server.serve_forever()
