"""The values the KV calls take and give: keys and values as bytes (a
``str`` is sent as UTF-8), a key with its revisions, and a batch's
operations and conditions."""

from dataclasses import dataclass
from typing import Mapping, Optional, Union

from latchkey._proto import latchkey_pb2 as pb

Bytes = Union[bytes, str]


def as_bytes(value: Bytes) -> bytes:
    """Keys and values are bytes; a ``str`` is sent as UTF-8. Anything
    else (an ``int`` would make that many zero bytes) is a ``TypeError``."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"latchkey: keys and values are bytes or str, not {type(value).__name__}")


@dataclass(frozen=True)
class KeyValue:
    """A key, its value, and its revisions (etcd's meaning): the cluster
    revision that created it and that last changed it, and how many times
    it was written since it was created."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int

    @staticmethod
    def of(kv: "pb.KeyValue") -> "KeyValue":
        return KeyValue(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)


@dataclass(frozen=True)
class Put:
    """A put in a :meth:`Client.batch`."""

    key: Bytes
    value: Bytes


@dataclass(frozen=True)
class Delete:
    """A delete in a :meth:`Client.batch`."""

    key: Bytes


def put_op(op: Union[Put, Delete]) -> "pb.BatchOp":
    """The wire form of a batch's operation."""
    if isinstance(op, Put):
        return pb.BatchOp(put=pb.PutRequest(key=as_bytes(op.key), value=as_bytes(op.value)))
    if isinstance(op, Delete):
        return pb.BatchOp(delete=pb.DeleteRequest(key=as_bytes(op.key)))
    raise TypeError(f"latchkey: a batch holds Put and Delete, not {type(op).__name__}")


def conditions(expect: Mapping[Bytes, Optional[Bytes]]) -> "list[pb.Condition]":
    """Conditions that each key holds the value given (``None``: absent)."""
    out = []
    for key, value in expect.items():
        test = pb.Test(absent=pb.Absent()) if value is None else pb.Test(value=as_bytes(value))
        out.append(pb.Condition(key=as_bytes(key), test=test))
    return out
