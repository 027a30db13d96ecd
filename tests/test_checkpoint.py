"""Signed checkpoints, the pure part: keys, the JSON round trip, and what extends a checkpoint."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

import orjson
import pytest

from eventstore.core.checkpoints import (
    Checkpoint,
    CurrentSession,
    ErasedSession,
    SessionHead,
    check_checkpoint,
    generate_keypair,
    load_private_key,
    load_public_key,
    sign_checkpoint,
)
from eventstore.errors import CheckpointError, EventStoreError

WHEN = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=timezone.utc)


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return generate_keypair()


def anchored() -> list[SessionHead]:
    return [
        SessionHead("s1", 10, h("s1@10")),
        SessionHead("s2", 40, h("s2@40"), baseline=20, baseline_hash=h("s2@20"), baseline_digest=h("s2 state@20")),
        SessionHead("ada@example.com", 3, h("ada@3")),
    ]


def same(a: SessionHead) -> CurrentSession:
    return CurrentSession(a.id, a.head, a.head_hash, a.baseline, a.baseline_hash, a.head_hash, a.baseline_digest)


def test_keypair_is_ed25519_pem_and_loads(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    assert private_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    assert load_private_key(private_pem).public_key() == load_public_key(public_pem)
    assert generate_keypair()[0] != private_pem


@pytest.mark.parametrize("bad", [b"", b"not a key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"])
def test_unusable_keys_are_checkpoint_errors(bad: bytes, keys: tuple[bytes, bytes]) -> None:
    with pytest.raises(CheckpointError):
        load_private_key(bad)
    with pytest.raises(CheckpointError):
        load_public_key(bad)
    with pytest.raises(CheckpointError):
        load_private_key(keys[1])  # a public key is not a private key
    with pytest.raises(CheckpointError):
        load_public_key("text")  # type: ignore[arg-type]
    assert issubclass(CheckpointError, EventStoreError)


def test_json_round_trip_is_equal_and_sorted(keys: tuple[bytes, bytes]) -> None:
    cp = sign_checkpoint(anchored(), keys[0], origin="postgresql+psycopg://app:***@db/chat", created_at=WHEN)
    text = cp.to_json()
    again = Checkpoint.from_json(text)
    assert again == cp
    assert again.to_json() == text
    assert [s.id for s in cp.sessions] == ["ada@example.com", "s1", "s2"]
    obj = orjson.loads(text)
    assert obj["created_at"] == "2026-11-30T12:00:00.123456Z"
    assert obj["kind"] == "eventstore.core.checkpoints" and obj["format"] == 2
    assert obj["sessions"][2] == {
        "id": "s2", "head": 40, "head_hash": h("s2@40").hex(),
        "baseline": 20, "baseline_hash": h("s2@20").hex(), "baseline_digest": h("s2 state@20").hex(),
    }
    # The signature covers exactly the object without it, keys sorted, no whitespace.
    del obj["signature"]
    assert cp.signed_bytes() == orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    assert cp.session("s1") == anchored()[0] and cp.session("nope") is None
    assert check_checkpoint(again, keys[1], [same(a) for a in anchored()]) == []


@pytest.mark.parametrize(
    "text",
    [
        "", "[]", "{}", "not json",
        '{"kind":"other","format":1,"created_at":"2026-11-30T12:00:00Z","origin":"x","sessions":[],"signature":"00"}',
    ],
)
def test_malformed_checkpoints_are_refused(text: str) -> None:
    with pytest.raises(CheckpointError):
        Checkpoint.from_json(text)


def test_edited_fields_are_refused_or_fail_the_signature(keys: tuple[bytes, bytes]) -> None:
    cp = sign_checkpoint(anchored(), keys[0], origin="db", created_at=WHEN)
    obj = orjson.loads(cp.to_json())
    for edit in ("extra", "format", "head_hash_upper"):
        o = orjson.loads(cp.to_json())
        if edit == "extra":
            o["x"] = 1
        elif edit == "format":
            o["format"] = 3
        else:
            o["sessions"][0]["head_hash"] = o["sessions"][0]["head_hash"].upper()
        with pytest.raises(CheckpointError):
            Checkpoint.from_json(orjson.dumps(o))
    obj["sessions"][1]["head"] = 9  # a well-formed edit: parses, but the signature fails
    forged = Checkpoint.from_json(orjson.dumps(obj))
    problems = check_checkpoint(forged, keys[1], [same(a) for a in anchored()])
    assert [(p.session, p.kind) for p in problems] == [(None, "bad_signature")]
    other_public = generate_keypair()[1]
    assert check_checkpoint(cp, other_public, [])[0].kind == "bad_signature"


def _format_1(heads: list[SessionHead], private: bytes) -> Checkpoint:
    """A checkpoint as the first format wrote it: no baseline digests."""
    old = tuple(sorted((SessionHead(a.id, a.head, a.head_hash, a.baseline, a.baseline_hash) for a in heads), key=lambda a: a.id))
    unsigned = Checkpoint(sessions=old, created_at=WHEN, origin="db", signature=bytes(64), format=1)
    signature = load_private_key(private).sign(unsigned.signed_bytes())
    return Checkpoint(sessions=old, created_at=WHEN, origin="db", signature=signature, format=1)


def test_the_baseline_state_is_anchored_and_format_1_still_verifies(keys: tuple[bytes, bytes]) -> None:
    cp = sign_checkpoint(anchored(), keys[0], origin="db", created_at=WHEN)
    s2 = cp.session("s2")
    assert s2 is not None
    # The baseline snapshot rewritten with its compaction record: same hashes, another state.
    swapped = [same(a) if a.id != "s2" else CurrentSession("s2", 40, s2.head_hash, 20, s2.baseline_hash, s2.head_hash, h("forged"))
               for a in anchored()]
    assert [(p.session, p.kind) for p in check_checkpoint(cp, keys[1], swapped)] == [("s2", "baseline_rewritten")]
    # Compacted further since: the anchored baseline's state is no longer served, nothing to compare.
    later = [same(a) if a.id != "s2" else CurrentSession("s2", 40, s2.head_hash, 30, h("s2@30"), s2.head_hash, h("x"))
             for a in anchored()]
    assert check_checkpoint(cp, keys[1], later) == []
    old = _format_1(anchored(), keys[0])
    text = old.to_json()
    assert orjson.loads(text)["format"] == 1 and "baseline_digest" not in orjson.loads(text)["sessions"][2]
    again = Checkpoint.from_json(text)
    assert again == old and again.to_json() == text
    assert check_checkpoint(again, keys[1], [same(a) for a in anchored()]) == []
    with pytest.raises(CheckpointError):  # a format 1 checkpoint has no digest member
        doc = orjson.loads(text)
        doc["sessions"][2]["baseline_digest"] = None
        Checkpoint.from_json(orjson.dumps(doc))
    with pytest.raises(CheckpointError):
        SessionHead("a", 3, h("a"), baseline_digest=h("d"))  # a digest without a baseline


def test_sign_refuses_bad_input(keys: tuple[bytes, bytes]) -> None:
    with pytest.raises(CheckpointError, match="password"):
        sign_checkpoint([], keys[0], origin="postgresql://app:secret@db/chat", created_at=WHEN)
    with pytest.raises(CheckpointError, match="twice"):
        sign_checkpoint([SessionHead("a", 1, h("a")), SessionHead("a", 2, h("b"))], keys[0], origin="db", created_at=WHEN)
    with pytest.raises(CheckpointError):
        sign_checkpoint([], keys[0], origin="db", created_at=datetime(2026, 1, 1))
    with pytest.raises(CheckpointError):
        SessionHead("a", -1, h("a"))
    with pytest.raises(CheckpointError):
        SessionHead("a", 1, b"short")
    with pytest.raises(CheckpointError):
        SessionHead("a", 1, h("a"), baseline=2, baseline_hash=h("b"))
    with pytest.raises(CheckpointError):
        sign_checkpoint([], keys[1], origin="db", created_at=WHEN)  # the public key cannot sign


def test_what_extends_a_checkpoint_and_what_does_not(keys: tuple[bytes, bytes]) -> None:
    s1, s2, ada = anchored()
    cp = sign_checkpoint([s1, s2, ada], keys[0], origin="db", created_at=WHEN)

    def kinds(*current: CurrentSession | ErasedSession) -> list[tuple[str | None, str]]:
        return [(p.session, p.kind) for p in check_checkpoint(cp, keys[1], current)]

    grown = CurrentSession("s1", 15, h("s1@15"), 0, None, s1.head_hash)
    compacted = CurrentSession("s2", 60, h("s2@60"), 50, h("s2@50"), s2.head_hash)
    erased = ErasedSession("ada@example.com", 5, h("ada@5"), WHEN, "admin:kim", "user request")
    assert kinds(grown, compacted, same(ada)) == []
    problems = check_checkpoint(cp, keys[1], [grown, compacted, erased])
    assert [(p.session, p.kind, p.tampering) for p in problems] == [("ada@example.com", "erased", False)]
    assert "admin:kim" in problems[0].message and "user request" in problems[0].message

    assert kinds(grown, compacted) == [("ada@example.com", "vanished")]
    assert kinds(CurrentSession("s1", 9, h("s1@9"), 0, None, None), same(s2), same(ada)) == [("s1", "head_moved_back")]
    # A recomputed chain: longer, internally consistent, but another hash at the anchor.
    recomputed = CurrentSession("s1", 12, h("forged@12"), 0, None, h("forged@10"))
    assert kinds(recomputed, same(s2), same(ada)) == [("s1", "rewritten")]
    # Compacted past the anchor without a record of the removed hashes: not provable.
    lost = CurrentSession("s2", 60, h("s2@60"), 50, h("s2@50"), None)
    assert kinds(same(s1), lost, same(ada)) == [("s2", "rewritten")]
    back = CurrentSession("s2", 40, s2.head_hash, 10, h("s2@10"), s2.head_hash)
    assert kinds(same(s1), back, same(ada)) == [("s2", "baseline_moved_back")]
    rebased = CurrentSession("s2", 40, s2.head_hash, 20, h("other@20"), s2.head_hash)
    assert kinds(same(s1), rebased, same(ada)) == [("s2", "baseline_rewritten")]
    early = ErasedSession("ada@example.com", 2, h("ada@2"), WHEN, None, "why")
    assert kinds(same(s1), same(s2), early)[0] == ("ada@example.com", "erased_inconsistent")
    with pytest.raises(CheckpointError, match="twice"):
        check_checkpoint(cp, keys[1], [same(s1), same(s1)])
