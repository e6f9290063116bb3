"""A fenced lock from Python with the latchkey package (clients/python).

    pip install ./clients/python
    python examples/python/fenced_lock.py 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103

Takes the lock "reports/nightly", writes who holds it through the lock's
fence (a write the cluster refuses once the lock is lost), reads it back
and releases. `cargo xtask test` runs it against a real cluster.
"""

import sys

import latchkey

endpoints = sys.argv[1].split(",")
with latchkey.Client(endpoints) as client:
    with client.session(ttl=10) as session, session.lock("reports/nightly") as guard:
        guard.put("reports/nightly/owner", f"token {guard.token}")
        print(f"holding {guard.name} with token {guard.token}")
        print("owner:", client.get("reports/nightly/owner").decode())
    print("released and closed")
