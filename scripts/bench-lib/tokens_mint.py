"""The tokens of scripts/bench-tokens, minted by PyJWT (tests/jwt/mint.py, from the repository's
root, with the interpreter running this) with the keys in DIR: for RS256 (rsa) and ES256 (ec),
N distinct tokens (their jti differs) in DIR/KEY-uncached.txt and the first of them in
DIR/KEY-cached.txt, one `Bearer TOKEN` a line.

    tokens_mint.py DIR N
"""

import json, subprocess, sys, time
d, n = sys.argv[1], int(sys.argv[2])
now = int(time.time())
def claims(i):
    return {"iss": "https://idp.bench/", "aud": "api.bench", "sub": "user-%d" % i,
            "org_id": "acme", "exp": now + 7200, "iat": now, "jti": "t-%d" % i}
for key in ("rsa", "ec"):
    specs = [{"key": key, "claims": claims(i)} for i in range(n)]
    out = subprocess.run([sys.executable, "tests/jwt/mint.py", "tokens", d, "-"],
                         input=json.dumps(specs), capture_output=True, text=True,
                         check=True).stdout
    tokens = json.loads(out)
    open("%s/%s-uncached.txt" % (d, key), "w").write("".join("Bearer %s\n" % t for t in tokens))
    open("%s/%s-cached.txt" % (d, key), "w").write("Bearer %s\n" % tokens[0])
