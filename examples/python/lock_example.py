#!/usr/bin/env python3
"""A latchkey lock from Python: session, keep-alive, wait for the lock,
fenced put, release, close.

From the repository root (the stubs, latchkey_pb2*.py, go to the current
directory, hence PYTHONPATH=.):

    pip install grpcio grpcio-tools
    python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. proto/latchkey.proto
    PYTHONPATH=. python examples/python/lock_example.py 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103

The endpoints (comma- or space-separated) default to the README's cluster.
With `--cacert FILE` (the CA that signs the replicas' certificates, e.g.
`certs/ca.pem` from `latchkey certs`) it talks TLS, and with `--cert FILE
--key FILE` too it presents a client certificate (replicas started with
--client-cert-auth require one):

    PYTHONPATH=. python examples/python/lock_example.py --cacert certs/ca.pem \
        --cert certs/client.pem --key certs/client-key.pem 127.0.0.1:7101
"""
import sys
import threading
import time

import grpc
import latchkey_pb2 as pb
import latchkey_pb2_grpc as rpc

args = sys.argv[1:]


def option(name):
    """The bytes of the file given after `name`, removed from args; or None."""
    if name not in args:
        return None
    i = args.index(name)
    with open(args[i + 1], "rb") as f:
        data = f.read()
    del args[i : i + 2]
    return data


ca, cert, key = option("--cacert"), option("--cert"), option("--key")
credentials = None  # plaintext unless --cacert
if ca:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
endpoints = ",".join(args) or "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
endpoints = endpoints.split(",")
leader = [endpoints[0]]  # writes go to the leader; NOT_LEADER names it
channels = {}  # one channel (HTTP/2 connection) per replica, reused


def call(service, method, request, timeout=10.0):
    """Send to the leader; follow NOT_LEADER, retry UNAVAILABLE (bounded)."""
    for attempt in range(30):
        if leader[0] not in channels:
            channels[leader[0]] = (
                grpc.secure_channel(leader[0], credentials)
                if credentials
                else grpc.insecure_channel(leader[0])
            )
        stub = getattr(rpc, service + "Stub")(channels[leader[0]])
        try:
            reply = getattr(stub, method)(request, timeout=timeout)
        except grpc.RpcError as e:  # no answer (every call here is idempotent)
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        else:
            if not reply.HasField("error"):  # errors are in the reply
                return reply
            kind = reply.error.kind
            if kind not in (pb.ERROR_KIND_NOT_LEADER, pb.ERROR_KIND_UNAVAILABLE):
                raise RuntimeError(f"{method}: {pb.ErrorKind.Name(kind)}: {reply.error.message}")
            if reply.error.leader_addr:
                leader[0] = reply.error.leader_addr
                continue
        leader[0] = endpoints[(attempt + 1) % len(endpoints)]  # try another replica
        time.sleep(min(0.05 * 2**attempt, 1.0))
    raise RuntimeError(f"{method}: no leader answered")


TTL_MS = 6000
opened = call("Lock", "OpenSession", pb.OpenSessionRequest(ttl_ms=TTL_MS))
# The secret proves the session is ours: every request for it carries it.
session, secret = opened.session, opened.secret
stop = threading.Event()


def keep_alive():  # at least every ttl/3, or the session (and its locks) ends
    while not stop.wait(TTL_MS / 3 / 1000):
        call("Lock", "KeepAlive", pb.KeepAliveRequest(session=session, session_secret=secret),
             timeout=TTL_MS / 3 / 1000)


threading.Thread(target=keep_alive, daemon=True).start()
print(f"session {session} opened")

# Wait up to 30 s in the lock's FIFO queue. The call is held up to hold_ms;
# answered `queued` after that: ask again with the same request_id.
acquire = pb.AcquireRequest(session=session, session_secret=secret, request_id=1,
                            name="example/printer",
                            mode=pb.LOCK_MODE_EXCLUSIVE, wait_ms=30000, hold_ms=5000)
reply = call("Lock", "Acquire", acquire, timeout=15.0)
while reply.WhichOneof("result") == "queued":
    print(f"queued, {reply.queued.position} ahead")
    reply = call("Lock", "Acquire", acquire, timeout=15.0)
sequencer = reply.granted.sequencer
print(f"holding {sequencer.name} with fencing token {sequencer.token}")

# A write that is applied only while this grant is the lock's current one.
put = pb.BatchOp(put=pb.PutRequest(key=b"example/printer/job", value=b"page 1"))
call("Lock", "FencedWrite",
     pb.FencedWriteRequest(sequencer=sequencer, session_secret=secret, ops=[put]))
value = call("Kv", "Get", pb.GetRequest(key=b"example/printer/job")).kv.value
print(f"fenced put done; example/printer/job = {value.decode()}")

call("Lock", "Release", pb.ReleaseRequest(session=session, session_secret=secret, request_id=2,
                                          name=sequencer.name, token=sequencer.token))
stop.set()
call("Lock", "CloseSession", pb.CloseSessionRequest(session=session, session_secret=secret))
print("released and closed")
