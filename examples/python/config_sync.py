#!/usr/bin/env python3
"""Keep a local copy of a configuration in sync with latchkey, from Python:
list the keys under a prefix, then watch them from the revision the list saw
(nothing missed, nothing applied twice). When a watch breaks (a replica
stops, the connection drops) it is opened again at the next replica from the
last revision seen plus one.

From the repository root, with stubs generated as for lock_example.py:

    PYTHONPATH=. python examples/python/config_sync.py 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103

It writes a few keys under its own prefix, follows them, and prints the copy
once it matches what the cluster holds.
"""
import sys
import threading
import time

import grpc
import latchkey_pb2 as pb
import latchkey_pb2_grpc as rpc

endpoints = ",".join(sys.argv[1:]) or "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
endpoints = endpoints.split(",")
prefix = b"config-example/%d/" % time.time_ns()


def channel(addr):
    return grpc.insecure_channel(addr)


def leader_call(method, request):
    """A KV call at the leader: follow NOT_LEADER, retry UNAVAILABLE (bounded)."""
    addr = endpoints[0]
    for _ in range(50):
        reply = getattr(rpc.KvStub(channel(addr)), method)(request, timeout=10)
        if not reply.HasField("error"):
            return reply
        if reply.error.kind == pb.ERROR_KIND_NOT_LEADER and reply.error.leader_addr:
            addr = reply.error.leader_addr
        elif reply.error.retryable:
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{method}: {reply.error.message}")
    raise RuntimeError(f"{method}: no leader answered")


class ConfigCopy:
    """A dict kept equal to the keys under `prefix`, and the revision it is at."""

    def __init__(self):
        self.values = {}
        self.revision = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def load(self):
        """List the prefix: the copy and the revision the list read at."""
        page = leader_call("Scan", pb.ScanRequest(prefix=prefix))
        with self.lock:
            self.values = {kv.key: kv.value for kv in page.entries}
            self.revision = page.revision

    def follow(self):
        """Watch from the revision after the copy's, at each replica in turn."""
        turn = 0
        while not self.stop.is_set():
            addr = endpoints[turn % len(endpoints)]
            turn += 1
            request = pb.WatchRequest(prefix=prefix, start_revision=self.revision + 1)
            try:
                for reply in rpc.WatchStub(channel(addr)).Watch(request):
                    if self.stop.is_set():
                        return
                    if reply.HasField("error"):
                        if reply.error.kind == pb.ERROR_KIND_COMPACTED:
                            self.load()  # too far behind: read everything again
                        break  # anything else: resume at the next replica
                    with self.lock:
                        for event in reply.events:
                            if event.type == pb.EVENT_TYPE_PUT:
                                self.values[event.key] = event.kv.value
                            else:
                                self.values.pop(event.key, None)
                        self.revision = max(self.revision, reply.revision)
            except grpc.RpcError:
                time.sleep(0.2)  # the replica went away: try the next one


copy = ConfigCopy()
leader_call("Put", pb.PutRequest(key=prefix + b"timeout", value=b"5s"))
copy.load()
follower = threading.Thread(target=copy.follow, daemon=True)
follower.start()
leader_call("Put", pb.PutRequest(key=prefix + b"timeout", value=b"10s"))
leader_call("Put", pb.PutRequest(key=prefix + b"mode", value=b"blue"))
last = leader_call("Delete", pb.DeleteRequest(key=prefix + b"mode")).revision
deadline = time.time() + 30
while copy.revision < last:
    if time.time() > deadline:
        sys.exit(f"the copy did not reach revision {last} (at {copy.revision})")
    time.sleep(0.05)
copy.stop.set()
stored = {kv.key: kv.value for kv in leader_call("Scan", pb.ScanRequest(prefix=prefix)).entries}
with copy.lock:
    if copy.values != stored:
        sys.exit(f"the copy {copy.values} differs from the cluster's {stored}")
    print(f"in sync at revision {copy.revision}: {copy.values}")
