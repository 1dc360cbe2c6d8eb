"""Keys and tokens for tests/jwt.rs, made with PyJWT and cryptography (another library than
the gateway's jsonwebtoken), and the malformed tokens of the bad-token corpus made by hand.

    mint.py keys DIR        RSA 2048 (RS256, and PS256), EC P-256, EC P-384 and Ed25519 private
                            keys in DIR, and DIR/jwks.json with their public halves (kid rsa-1,
                            ps-1, ec-1, ec384-1, ed-1; a second RS256 key rsa-2 goes to
                            DIR/jwks-rotated.json with rsa-1)
    mint.py tokens DIR SPEC  SPEC: a JSON list of {"key", "alg", "claims", "headers", "raw"}
                            (`-`: read it from standard input); prints a JSON list of tokens

A spec's "key" is rsa, rsa2, ps, ec, ec384 or ed (DIR's private keys), "hmac:<secret>", "none"
(alg none, unsigned) or "rsa-public-as-hmac" (HS256 signed with the RSA public key's PEM: the
algorithm confusion attack). "raw": the claims are this text as it is (not JSON-encoded), for
duplicate keys and non-JSON claims. "headers" are added to the JOSE header.
"""

import base64
import hashlib
import hmac
import json
import os
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

KEYS = {
    "rsa": ("rsa.pem", RSAAlgorithm, "rsa-1", "RS256"),
    "rsa2": ("rsa2.pem", RSAAlgorithm, "rsa-2", "RS256"),
    "ps": ("ps.pem", RSAAlgorithm, "ps-1", "PS256"),
    "ec": ("ec.pem", ECAlgorithm, "ec-1", "ES256"),
    "ec384": ("ec384.pem", ECAlgorithm, "ec384-1", "ES384"),
    "ed": ("ed.pem", OKPAlgorithm, "ed-1", "EdDSA"),
}


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def private(d, name):
    with open(os.path.join(d, KEYS[name][0]), "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def jwk(d, name):
    _, algo, kid, alg = KEYS[name]
    j = json.loads(algo.to_jwk(private(d, name).public_key()))
    j.update({"kid": kid, "alg": alg, "use": "sig"})
    return j


def keys(d):
    made = {
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "rsa2": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ps": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec": ec.generate_private_key(ec.SECP256R1()),
        "ec384": ec.generate_private_key(ec.SECP384R1()),
        "ed": ed25519.Ed25519PrivateKey.generate(),
    }
    for name, key in made.items():
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        with open(os.path.join(d, KEYS[name][0]), "wb") as f:
            f.write(pem)
    with open(os.path.join(d, "jwks.json"), "w") as f:
        json.dump({"keys": [jwk(d, n) for n in ("rsa", "ps", "ec", "ec384", "ed")]}, f)
    with open(os.path.join(d, "jwks-rotated.json"), "w") as f:
        json.dump({"keys": [jwk(d, n) for n in ("rsa", "rsa2")]}, f)


def token(d, spec):
    key = spec.get("key", "rsa")
    headers = spec.get("headers", {})
    raw = spec.get("raw")
    claims = spec.get("claims", {})
    if key == "none":
        head = {"alg": "none", "typ": "JWT", **headers}
        body = raw.encode() if raw is not None else json.dumps(claims).encode()
        return "%s.%s." % (b64(json.dumps(head).encode()), b64(body))
    if key == "rsa-public-as-hmac":
        secret = private(d, "rsa").public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        head = {"alg": "HS256", "typ": "JWT", "kid": "rsa-1", **headers}
        msg = "%s.%s" % (b64(json.dumps(head).encode()), b64(json.dumps(claims).encode()))
        sig = hmac.new(secret, msg.encode(), hashlib.sha256).digest()
        return "%s.%s" % (msg, b64(sig))
    if key.startswith("hmac:"):
        signing, alg, kid = key[5:].encode(), spec.get("alg", "HS256"), None
    else:
        signing, alg, kid = private(d, key), spec.get("alg", KEYS[key][3]), KEYS[key][2]
    head = dict(headers)
    if kid is not None and "kid" not in head:
        head["kid"] = kid
    if raw is not None:
        return jwt.api_jws.encode(raw.encode(), signing, algorithm=alg, headers=head)
    return jwt.encode(claims, signing, algorithm=alg, headers=head)


def main():
    if sys.argv[1] == "keys":
        keys(sys.argv[2])
    else:
        d = sys.argv[2]
        specs = json.load(sys.stdin) if sys.argv[3] == "-" else json.loads(sys.argv[3])
        print(json.dumps([token(d, s) for s in specs]))


if __name__ == "__main__":
    main()
