"""A fenced lock from Python with the latchkey package (clients/python).

    pip install ./clients/python
    python examples/python/fenced_lock.py 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
    python examples/python/fenced_lock.py --cacert certs/ca.pem \\
        --cert certs/client.pem --key certs/client-key.pem ENDPOINTS   # mutual TLS

Takes the lock "reports/nightly", writes who holds it through the lock's
fence (a write the cluster refuses once the lock is lost), reads it back
and releases. `cargo xtask test` runs it against a real cluster, plain and
over mutual TLS.
"""

import argparse

import latchkey

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("endpoints", help="host:port of every replica, comma-separated")
parser.add_argument("--cacert", help="the CA to trust (TLS)")
parser.add_argument("--cert", help="this client's certificate (mutual TLS)")
parser.add_argument("--key", help="this client's private key (mutual TLS)")
args = parser.parse_args()
tls = latchkey.Tls(args.cacert, args.cert, args.key) if args.cacert else None

with latchkey.Client(args.endpoints.split(","), tls=tls) as client:
    with client.session(ttl=10) as session, session.lock("reports/nightly") as guard:
        guard.put("reports/nightly/owner", f"token {guard.token}")
        print(f"holding {guard.name} with token {guard.token}")
        print("owner:", client.get("reports/nightly/owner").decode())
    print("released and closed")
