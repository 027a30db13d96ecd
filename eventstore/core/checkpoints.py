"""Signed checkpoints: an anchor for the hash chain kept outside the database.

A checkpoint is a signed statement of every session's head (version and hash) and
compaction baseline at one moment. Whoever can write the database can rewrite a session
and recompute its whole hash chain, and plain ``verify`` then finds nothing; but they
cannot make the rewritten chain pass through a head hash that was signed earlier and
kept where they cannot reach it. :func:`check_checkpoint` decides, per anchored session,
whether the database's present state still *extends* the anchored one.

Everything here is pure (no I/O, no clock unless none is given): the store reads the
database, builds :class:`CurrentSession` / :class:`ErasedSession` values and asks.

Keys are Ed25519 (the ``cryptography`` package), exchanged as PEM bytes: the private key
as unencrypted PKCS#8, the public key as SubjectPublicKeyInfo.

The signed bytes (:meth:`Checkpoint.signed_bytes`) are the checkpoint's JSON object
without its ``signature`` member, serialised by orjson with sorted keys and no
whitespace. Every value in it is a string, an integer or ``null`` (hashes are lowercase
hex; the time is ISO 8601 UTC with microseconds), so any JSON implementation that sorts
keys reproduces the bytes exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from eventstore.errors import CheckpointError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

#: An Ed25519 key class (private or public), for the one PEM loader.
K = TypeVar("K")

# `cryptography` is imported by the functions that sign or verify: it costs more start-up
# time than the rest of this module, and most commands never touch a key.

__all__ = [
    "FORMAT",
    "FORMATS",
    "KIND",
    "HASH_SIZE",
    "SessionHead",
    "Checkpoint",
    "CurrentSession",
    "ErasedSession",
    "RewoundSession",
    "CheckpointProblem",
    "generate_keypair",
    "load_private_key",
    "load_public_key",
    "sign_checkpoint",
    "check_checkpoint",
]

#: The checkpoint format this module writes. Format 2 adds each session's
#: ``baseline_digest``; format 1 checkpoints (without it) are still read and verified.
FORMAT = 2
#: Every format :meth:`Checkpoint.from_json` reads.
FORMATS = (1, 2)
#: Names what the signed bytes are, so a signature can never be replayed as another kind.
KIND = "eventstore.core.checkpoints"
#: Bytes of a chain hash (SHA-256).
HASH_SIZE = 32

# userinfo with a password in a URL: scheme://user:secret@host
_PASSWORD_IN_URL = re.compile(r"://[^/@]*:[^/@]*@")
_MAX_ORIGIN = 1024


# -- keys ---------------------------------------------------------------------------------


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh Ed25519 key pair for signing checkpoints.

    Returns:
        ``(private_pem, public_pem)``: the private key as unencrypted PKCS#8 PEM (keep it
        off the database host) and the public key as SubjectPublicKeyInfo PEM (give it to
        whoever verifies).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def _load_key(pem: Any, key_type: type[K], load: Callable[[bytes], object], which: str, use: str) -> K:
    """A key of ``key_type`` from PEM bytes with ``load`` (an already loaded one is returned
    as is); ``which`` (private, public) and ``use`` (signed, verified) name it in errors."""
    if isinstance(pem, key_type):
        return pem
    if not isinstance(pem, (bytes, bytearray)):
        raise CheckpointError(f"a {which} key must be PEM bytes, not {type(pem).__name__}")
    try:
        key = load(bytes(pem))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"not a usable PEM {which} key: {_first_line(exc)}") from exc
    if not isinstance(key, key_type):
        raise CheckpointError(f"checkpoints are {use} with Ed25519 keys, not {type(key).__name__}")
    return key


def load_private_key(pem: bytes | Ed25519PrivateKey) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM bytes (an already loaded key is returned as is).

    Raises:
        CheckpointError: not PEM, encrypted, or not an Ed25519 private key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return _load_key(
        pem,
        Ed25519PrivateKey,
        lambda b: serialization.load_pem_private_key(b, password=None),
        "private",
        "signed",
    )


def load_public_key(pem: bytes | Ed25519PublicKey) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM bytes (an already loaded key is returned as is).

    Raises:
        CheckpointError: not PEM, or not an Ed25519 public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return _load_key(pem, Ed25519PublicKey, serialization.load_pem_public_key, "public", "verified")


# -- what a checkpoint holds --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionHead:
    """One session as a checkpoint anchors it.

    Attributes:
        id: the session id.
        head: its head version.
        head_hash: the chain hash at ``head`` (32 bytes; for a fresh branch whose head is
            its fork version, the hash at that version of its parent).
        baseline: its compaction baseline (0: never compacted).
        baseline_hash: the chain hash at ``baseline`` (``None`` when never compacted).
        baseline_digest: the SHA-256 of the baseline state's canonical JSON
            (:func:`eventstore.core.codec.state_digest`), so a baseline snapshot rewritten
            together with its compaction record is still caught (``None`` when never
            compacted, and in format 1 checkpoints, which did not anchor it).
    """

    id: str
    head: int
    head_hash: bytes
    baseline: int = 0
    baseline_hash: bytes | None = None
    baseline_digest: bytes | None = None

    def __post_init__(self) -> None:
        _check_id(self.id)
        _check_version(self.head, "head")
        _check_hash(self.head_hash, f"head hash of session {self.id!r}")
        _check_version(self.baseline, "baseline")
        if self.baseline > self.head:
            raise CheckpointError(
                f"session {self.id!r}: baseline {self.baseline} is above head {self.head}"
            )
        if self.baseline_hash is not None:
            _check_hash(self.baseline_hash, f"baseline hash of session {self.id!r}")
        elif self.baseline:
            raise CheckpointError(f"session {self.id!r}: a baseline needs its hash")
        if self.baseline_digest is not None:
            _check_hash(self.baseline_digest, f"baseline digest of session {self.id!r}")
            if not self.baseline:
                raise CheckpointError(f"session {self.id!r}: a baseline digest needs a baseline")

    def to_json(self, fmt: int = FORMAT) -> dict[str, Any]:
        """The session's JSON object inside a checkpoint of format ``fmt``."""
        obj: dict[str, Any] = {
            "id": self.id,
            "head": self.head,
            "head_hash": self.head_hash.hex(),
            "baseline": self.baseline,
            "baseline_hash": None if self.baseline_hash is None else self.baseline_hash.hex(),
        }
        if fmt >= 2:
            obj["baseline_digest"] = None if self.baseline_digest is None else self.baseline_digest.hex()
        return obj

    @classmethod
    def from_json(cls, obj: Any, fmt: int = FORMAT) -> SessionHead:
        """Parse :meth:`to_json`'s object (of a checkpoint of format ``fmt``).

        Raises:
            CheckpointError: a member is missing, of the wrong type, or not valid.
        """
        names = ("id", "head", "head_hash", "baseline", "baseline_hash")
        m = _members(obj, "session", names + (("baseline_digest",) if fmt >= 2 else ()))
        baseline_hash = m["baseline_hash"]
        digest = m.get("baseline_digest")
        return cls(
            id=_str(m["id"], "session id"),
            head=_int(m["head"], "head"),
            head_hash=_unhex(m["head_hash"], "head_hash"),
            baseline=_int(m["baseline"], "baseline"),
            baseline_hash=None if baseline_hash is None else _unhex(baseline_hash, "baseline_hash"),
            baseline_digest=None if digest is None else _unhex(digest, "baseline_digest"),
        )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement of every session's head at one moment.

    Attributes:
        sessions: the anchored sessions, sorted by id (ids are unique).
        created_at: when it was made (aware, UTC, microsecond precision).
        origin: names the database it was taken from (a masked URL or a name of your
            choosing; never a password).
        signature: the Ed25519 signature (64 bytes) of :meth:`signed_bytes`.
        format: the checkpoint format (:data:`FORMAT`).
    """

    sessions: tuple[SessionHead, ...]
    created_at: datetime
    origin: str
    signature: bytes
    format: int = FORMAT
    _by_id: Mapping[str, SessionHead] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise CheckpointError(f"checkpoint format {self.format!r} is not supported")
        if not isinstance(self.sessions, tuple) or not all(
            isinstance(s, SessionHead) for s in self.sessions
        ):
            raise CheckpointError("a checkpoint's sessions must be a tuple of SessionHead")
        if self.format < 2 and any(s.baseline_digest is not None for s in self.sessions):
            raise CheckpointError("a format 1 checkpoint anchors no baseline digest")
        ids = [s.id for s in self.sessions]
        if ids != sorted(ids) or len(set(ids)) != len(ids):
            raise CheckpointError("a checkpoint's sessions must be unique and sorted by id")
        if not isinstance(self.created_at, datetime) or self.created_at.tzinfo is None:
            raise CheckpointError("a checkpoint's created_at must be an aware datetime")
        _check_origin(self.origin)
        if not isinstance(self.signature, bytes) or len(self.signature) != 64:
            raise CheckpointError("a checkpoint's signature must be 64 bytes")
        object.__setattr__(self, "_by_id", {s.id: s for s in self.sessions})

    def session(self, session_id: str) -> SessionHead | None:
        """The anchored head of one session, or ``None`` when the checkpoint has none."""
        return self._by_id.get(session_id)

    def signed_bytes(self) -> bytes:
        """The exact bytes the signature covers (see the module docstring)."""
        return _canonical(_body(self.sessions, self.created_at, self.origin, self.format))

    def to_json(self) -> str:
        """The checkpoint as one line of JSON (sorted keys): what to store and publish."""
        body = _body(self.sessions, self.created_at, self.origin, self.format)
        body["signature"] = self.signature.hex()
        return _canonical(body).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        """Parse :meth:`to_json`'s text. The signature is *not* checked here.

        Raises:
            CheckpointError: not JSON, not a checkpoint, or a member is invalid.
        """
        if not isinstance(text, (str, bytes, bytearray)):
            raise CheckpointError(f"a checkpoint is JSON text, not {type(text).__name__}")
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"a checkpoint must be JSON: {exc}") from exc
        m = _members(
            obj, "checkpoint", ("kind", "format", "created_at", "origin", "sessions", "signature")
        )
        if m["kind"] != KIND:
            raise CheckpointError(f"not an eventstore checkpoint (kind {m['kind']!r})")
        sessions = m["sessions"]
        if not isinstance(sessions, list):
            raise CheckpointError("a checkpoint's sessions must be a list")
        fmt = _int(m["format"], "format")
        if fmt not in FORMATS:
            raise CheckpointError(f"checkpoint format {fmt!r} is not supported")
        created = _str(m["created_at"], "created_at")
        try:
            created_at = datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError as exc:
            raise CheckpointError(f"created_at {created!r} is not an ISO 8601 time") from exc
        if created_at.tzinfo is None:
            raise CheckpointError(f"created_at {created!r} has no time zone")
        return cls(
            sessions=tuple(SessionHead.from_json(s, fmt) for s in sessions),
            created_at=created_at.astimezone(timezone.utc),
            origin=_str(m["origin"], "origin"),
            signature=_unhex(m["signature"], "signature"),
            format=fmt,
        )


def sign_checkpoint(
    heads: Iterable[SessionHead],
    private_key: bytes | Ed25519PrivateKey,
    *,
    origin: str,
    created_at: datetime,
) -> Checkpoint:
    """Sign a statement of these sessions' heads.

    Args:
        heads: every session to anchor (any order; ids must be unique).
        private_key: the Ed25519 private key (PEM bytes or a loaded key).
        origin: names the database (a masked URL or a name); refused when it carries a
            password.
        created_at: the checkpoint's time (the caller reads the clock). Stored in UTC, to the microsecond.

    Raises:
        CheckpointError: the key is unusable, an id repeats, or an argument is invalid.
    """
    key = load_private_key(private_key)
    sessions = tuple(sorted(heads, key=lambda s: s.id if isinstance(s, SessionHead) else ""))
    if not all(isinstance(s, SessionHead) for s in sessions):
        raise CheckpointError("heads must be SessionHead values")
    when = created_at
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise CheckpointError("created_at must be an aware datetime")
    when = when.astimezone(timezone.utc)
    _check_origin(origin)
    for a, b in zip(sessions, sessions[1:]):
        if a.id == b.id:
            raise CheckpointError(f"session {a.id!r} appears twice")
    signature = key.sign(_canonical(_body(sessions, when, origin, FORMAT)))
    return Checkpoint(sessions=sessions, created_at=when, origin=origin, signature=signature)


# -- checking a checkpoint against the database -------------------------------------------


@dataclass(frozen=True, slots=True)
class CurrentSession:
    """What the database holds now for a session a checkpoint anchors.

    Attributes:
        id: the session id.
        head: its head version now.
        head_hash: the chain hash at its head now.
        baseline: its compaction baseline now.
        baseline_hash: the chain hash at its baseline now (``None``: never compacted).
        hash_at_anchor: the hash the database holds *now* at the checkpoint's head version
            of this session: the event row's hash (in the session's lineage: a parent's for
            a version at or below the fork) when the row is there; the hash a compaction
            recorded for that version when compaction removed the row; ``None`` when
            neither exists (the version is beyond the head, or the row is gone without a
            compaction record).
        baseline_digest: the digest of the baseline state the database serves now (see
            :attr:`SessionHead.baseline_digest`; ``None`` when never compacted, or when
            not read because the checkpoint anchors none).
    """

    id: str
    head: int
    head_hash: bytes
    baseline: int
    baseline_hash: bytes | None
    hash_at_anchor: bytes | None
    baseline_digest: bytes | None = None


@dataclass(frozen=True, slots=True)
class ErasedSession:
    """The tombstone of a session erased through the API.

    Attributes:
        id: the session id.
        head: its head version when it was erased.
        head_hash: the chain hash at that head.
        erased_at: when (aware UTC).
        actor: who erased it (``None`` when not given).
        reason: why.
    """

    id: str
    head: int
    head_hash: bytes
    erased_at: datetime
    actor: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class RewoundSession:
    """A session rewound through the API past the version a checkpoint anchors: the
    anchored version now lives on in the line the rewind kept.

    Attributes:
        id: the session id.
        head: its head version now.
        kept: the id of the kept line that holds the anchored version.
        to: the version the session was rewound to.
        hash_at_anchor: the hash the kept line holds now at the anchored version (as
            :attr:`CurrentSession.hash_at_anchor`).
        rewound_at: when (aware UTC).
        actor: who rewound it (``None`` when not given).
        reason: why (``None`` when not given).
    """

    id: str
    head: int
    kept: str
    to: int
    hash_at_anchor: bytes | None
    rewound_at: datetime
    actor: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class CheckpointProblem:
    """One way the database does not extend a checkpoint.

    Attributes:
        session: the session concerned (``None`` for the checkpoint as a whole).
        kind: ``bad_signature``, ``vanished``, ``head_moved_back``, ``rewritten``,
            ``baseline_moved_back``, ``baseline_rewritten``, ``erased_inconsistent``,
            ``erased`` (an erasure through the API: reported, but not tampering), or
            ``rewound`` (a rewind through the API whose kept line still holds the
            anchored head: reported, but not tampering).
        message: one line for a person, naming the session and versions.
    """

    session: str | None
    kind: str
    message: str

    @property
    def tampering(self) -> bool:
        """``False`` only for an erasure or a rewind through the API, which the checkpoint
        accounts for."""
        return self.kind not in ("erased", "rewound")


def check_checkpoint(
    checkpoint: Checkpoint,
    public_key: bytes | Ed25519PublicKey,
    current_heads: Iterable[CurrentSession | ErasedSession | RewoundSession],
) -> list[CheckpointProblem]:
    """Whether the database, as described by ``current_heads``, still extends the checkpoint.

    A bad signature is the only problem reported then (nothing in the checkpoint can be
    trusted). Otherwise, for each anchored session (in id order):

    - erased through the API (a tombstone): ``erased`` with who, when and why, when the
      tombstone's head is at or beyond the anchored head (and its hash matches at the
      same version); ``erased_inconsistent`` when it is behind or differs;
    - rewound through the API to below the anchored head: ``rewound`` with who, when and
      why, when the kept line holds the anchored hash at the anchored version;
      ``rewritten`` when it does not;
    - missing with no tombstone: ``vanished``;
    - head now below the anchored head: ``head_moved_back``;
    - hash now held at the anchored version is not the anchored hash (or nothing is held
      there): ``rewritten`` — an anchored event was changed, removed, reordered or the
      chain was recomputed;
    - baseline now below the anchored one: ``baseline_moved_back``; at the same version
      with another hash, or (format 2) serving another state than the anchored digest:
      ``baseline_rewritten``.

    Sessions that only grew, or were compacted through the API (their compaction record
    keeps the hash of every version it removed), yield nothing. Sessions not in the
    checkpoint (created since) are not judged here: plain ``verify`` covers them.

    Args:
        checkpoint: the checkpoint, as parsed (see :meth:`Checkpoint.from_json`).
        public_key: the Ed25519 public key it must be signed with.
        current_heads: the present state of (at least) every anchored session.

    Raises:
        CheckpointError: the key is unusable, or ``current_heads`` names a session twice.
    """
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(public_key)
    try:
        key.verify(checkpoint.signature, checkpoint.signed_bytes())
    except InvalidSignature:
        return [
            CheckpointProblem(
                None,
                "bad_signature",
                f"the checkpoint of {checkpoint.created_at.isoformat()} from "
                f"{checkpoint.origin!r} is not signed by this key (altered, or another key)",
            )
        ]
    now: dict[str, CurrentSession | ErasedSession | RewoundSession] = {}
    for c in current_heads:
        if c.id in now:
            raise CheckpointError(f"session {c.id!r} is described twice")
        now[c.id] = c
    problems: list[CheckpointProblem] = []
    for anchored in checkpoint.sessions:
        problem = _check_one(anchored, now.get(anchored.id))
        if problem is not None:
            problems.append(problem)
    return problems


def _check_one(
    a: SessionHead, c: CurrentSession | ErasedSession | RewoundSession | None
) -> CheckpointProblem | None:
    sid = a.id
    at = f"session {sid!r}"
    if c is None:
        return CheckpointProblem(
            sid, "vanished", f"{at} (anchored at version {a.head}) is gone, with no tombstone"
        )
    if isinstance(c, ErasedSession):
        if c.head < a.head or (c.head == a.head and c.head_hash != a.head_hash):
            return CheckpointProblem(
                sid,
                "erased_inconsistent",
                f"{at} has a tombstone at version {c.head} that does not extend the anchored "
                f"version {a.head}",
            )
        by = f" by {c.actor!r}" if c.actor else ""
        return CheckpointProblem(
            sid,
            "erased",
            f"{at} was erased{by} at {c.erased_at.isoformat()}: {c.reason} "
            f"(head {c.head}; anchored at {a.head})",
        )
    if isinstance(c, RewoundSession):
        if c.hash_at_anchor != a.head_hash:
            return CheckpointProblem(
                sid,
                "rewritten",
                f"{at} was rewound to version {c.to}, but its kept line {c.kept!r} does not hold "
                f"the anchored version {a.head}",
            )
        by = f" by {c.actor!r}" if c.actor else ""
        why = f": {c.reason}" if c.reason else ""
        return CheckpointProblem(
            sid,
            "rewound",
            f"{at} was rewound{by} at {c.rewound_at.isoformat()} to version {c.to}{why}; the "
            f"anchored version {a.head} is kept as {c.kept!r}",
        )
    if c.head < a.head:
        return CheckpointProblem(
            sid,
            "head_moved_back",
            f"{at} is at version {c.head}, behind the anchored version {a.head}",
        )
    if c.hash_at_anchor != a.head_hash:
        held = "nothing" if c.hash_at_anchor is None else "another hash"
        return CheckpointProblem(
            sid,
            "rewritten",
            f"{at}: the database holds {held} at the anchored version {a.head}; the events up "
            "to it were changed, removed or re-created",
        )
    if c.baseline < a.baseline:
        return CheckpointProblem(
            sid,
            "baseline_moved_back",
            f"{at} has baseline {c.baseline}, below the anchored baseline {a.baseline}",
        )
    if c.baseline == a.baseline and c.baseline_hash != a.baseline_hash:
        return CheckpointProblem(
            sid,
            "baseline_rewritten",
            f"{at}: the hash at its baseline {a.baseline} is not the anchored one",
        )
    if c.baseline == a.baseline and a.baseline_digest is not None and c.baseline_digest != a.baseline_digest:
        return CheckpointProblem(
            sid,
            "baseline_rewritten",
            f"{at}: the state served at its baseline {a.baseline} is not the anchored one "
            "(the baseline snapshot was rewritten)",
        )
    return None


# -- helpers ------------------------------------------------------------------------------


def _body(
    sessions: Iterable[SessionHead], created_at: datetime, origin: str, fmt: int
) -> dict[str, Any]:
    return {
        "kind": KIND,
        "format": fmt,
        "created_at": created_at.astimezone(timezone.utc)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z"),
        "origin": origin,
        "sessions": [s.to_json(fmt) for s in sessions],
    }


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def _members(obj: Any, what: str, names: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise CheckpointError(f"a {what} must be a JSON object")
    missing = [n for n in names if n not in obj]
    extra = sorted(set(obj) - set(names))
    if missing or extra:
        raise CheckpointError(
            f"a {what} must have exactly the members {', '.join(names)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(map(repr, extra))}" if extra else "")
        )
    return obj


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise CheckpointError(f"{what} must be a string")
    return v


def _int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise CheckpointError(f"{what} must be an integer")
    return v


def _unhex(v: Any, what: str) -> bytes:
    s = _str(v, what)
    if s != s.lower():
        raise CheckpointError(f"{what} must be lowercase hex")
    try:
        return bytes.fromhex(s)
    except ValueError as exc:
        raise CheckpointError(f"{what} is not hex") from exc


def _check_id(v: Any) -> None:
    if not isinstance(v, str) or not v:
        raise CheckpointError("a session id must be a non-empty string")


def _check_version(v: Any, what: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 2**31 - 1:
        raise CheckpointError(f"{what} must be an integer in 0..2**31-1, not {v!r}")


def _check_hash(v: Any, what: str) -> None:
    if not isinstance(v, bytes) or len(v) != HASH_SIZE:
        raise CheckpointError(f"{what} must be {HASH_SIZE} bytes")


def _check_origin(origin: Any) -> None:
    if not isinstance(origin, str) or not origin or len(origin) > _MAX_ORIGIN:
        raise CheckpointError(f"origin must be a non-empty string of at most {_MAX_ORIGIN} chars")
    if _PASSWORD_IN_URL.search(origin) and ":***@" not in origin:
        raise CheckpointError("origin must not carry a password; pass the masked URL")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in origin):
        raise CheckpointError("origin must not contain control characters")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
