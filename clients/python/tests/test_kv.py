"""Keys and values: reads, writes, conditions, paging, sequences, and bad
input refused with a typed error."""

import pytest

import latchkey
from latchkey import Delete, Put


def test_put_get_delete(client, ns):
    key = ns + "a"
    assert client.get(key) is None
    revision = client.put(key, "1")
    kv = client.get_kv(key)
    assert kv.value == b"1" and kv.mod_revision == revision and kv.version == 1
    client.put(key, b"2")
    assert client.get(key) == b"2"
    assert client.get_kv(key).version == 2
    assert client.delete(key) is True
    assert client.delete(key) is False
    assert client.get(key) is None


def test_compare_and_put(client, ns):
    key = ns + "cas"
    assert client.compare_and_put(key, None, "first") is True
    assert client.compare_and_put(key, None, "again") is False
    assert client.compare_and_put(key, "wrong", "x") is False
    assert client.compare_and_put(key, "first", "second") is True
    assert client.get(key) == b"second"


def test_scan_pages_by_itself(client, ns):
    keys = [f"{ns}scan/{i:02}".encode() for i in range(7)]
    for i, k in enumerate(keys):
        client.put(k, str(i))
    client.put(ns + "scanx", "outside the prefix")
    seen = [kv.key for kv in client.scan(ns + "scan/", page=2)]
    assert seen == keys
    assert [kv.key for kv in client.scan(ns + "scan/", start=keys[3], end=keys[5])] == keys[3:5]


def test_batch_all_or_nothing(client, ns):
    a, b = ns + "ba", ns + "bb"
    assert client.batch([Put(a, "1"), Put(b, "1")], expect={a: None}) is True
    # A failed condition writes nothing.
    assert client.batch([Put(a, "2"), Delete(b)], expect={a: "nope"}) is False
    assert (client.get(a), client.get(b)) == (b"1", b"1")
    assert client.batch([Put(a, "2"), Delete(b)], expect={a: "1"}) is True
    assert (client.get(a), client.get(b)) == (b"2", None)


def test_sequences_never_repeat(client, ns):
    first = client.next_sequence(ns + "seq", 10)
    second = client.next_sequence(ns + "seq")
    assert len(first) == 10 and len(second) == 1
    assert second.start >= first.stop


def test_bad_input_is_refused_with_a_typed_error(client, ns):
    with pytest.raises(latchkey.InvalidArgument):
        client.put(b"k" * 5000, "too long a key")
    with pytest.raises(latchkey.InvalidArgument):
        client.put(b"", "an empty key")
    with pytest.raises(ValueError):
        list(client.scan(ns, page=0))
    with pytest.raises(ValueError):
        client.session(ttl=1)
    with pytest.raises(TypeError):
        client.batch(["not an op"])


def test_only_bytes_and_str_are_keys_and_values(client, ns):
    with pytest.raises(TypeError):
        client.put(ns + "int", 5)
    with pytest.raises(TypeError):
        client.get(7)


def test_an_unreachable_replica_is_skipped_for_writes(client, ns):
    from conftest import endpoints

    # Port 1 on loopback refuses connections: nothing is sent there.
    with latchkey.Client(["127.0.0.1:1", *endpoints()]) as c:
        c.put(ns + "skip", "written")
        assert c.get(ns + "skip") == b"written"
        with c.session(ttl=5) as s:
            assert s.lock(ns + "skip").try_acquire() is not None


def test_closing_the_client_stops_its_sessions_keep_alives(ns):
    from conftest import endpoints

    c = latchkey.Client(endpoints())
    s = c.session(ttl=3)
    c.close()
    s._thread.join(timeout=10)
    assert not s._thread.is_alive()
    with pytest.raises(latchkey.Unavailable):
        c.put(ns + "closed", "x")


def test_a_resent_write_is_answered_once(client, ns):
    from latchkey._proto import latchkey_pb2 as pb

    key = ns + "once"
    request = pb.NextSequenceRequest(key=key.encode(), step=5)
    first = client._writer.call("NextSequence", request)
    # The same request again (as after a lost answer), tag included: the
    # replicas answer the first outcome and hand out nothing new.
    again = client._router.call("Kv", "NextSequence", request, idempotent=True, write=True)
    assert (again.start, again.end) == (first.start, first.end)
    assert client.next_sequence(key).start == first.end
