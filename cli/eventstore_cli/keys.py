"""Key and checkpoint files for the audit commands (keygen, checkpoint, verify --checkpoint).

A missing, unreadable or garbled file is a :class:`~eventstore.CheckpointError`, so the
command reports it as one ``error:`` line and exits 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eventstore import Checkpoint

__all__ = ["write_keypair", "read_key", "read_checkpoint", "write_checkpoint"]

#: Key and checkpoint files are small; anything larger is not one.
_MAX_FILE = 1 << 20


def write_keypair(out: Path) -> tuple[Path, Path]:
    """Write a fresh Ed25519 key pair: ``out`` (the private key, mode 0600) and
    ``out.pub``. Never overwrites either file.

    Raises:
        CheckpointError: either file exists, or cannot be written.
    """
    from eventstore import CheckpointError, generate_keypair

    private_pem, public_pem = generate_keypair()
    pub = out.with_name(out.name + ".pub")
    for path in (out, pub):
        if path.exists():
            raise CheckpointError(f"{path} exists; keys are never overwritten (choose another --out)")
    try:
        # O_EXCL with the mode at creation: the private key is never readable by others,
        # not even for a moment.
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(private_pem)
        with open(pub, "xb") as fh:
            fh.write(public_pem)
    except OSError as exc:
        raise CheckpointError(f"cannot write the key pair at {out}: {exc.strerror or exc}") from exc
    return out, pub


def _read(path: Path, what: str) -> bytes:
    from eventstore import CheckpointError

    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_FILE + 1)
    except OSError as exc:
        raise CheckpointError(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > _MAX_FILE:
        raise CheckpointError(f"{path} is too large to be a {what}")
    return data


def read_key(path: Path, *, private: bool) -> bytes:
    """The PEM bytes of a key file, checked to be the right kind of Ed25519 key.

    Raises:
        CheckpointError: missing, unreadable, or not such a key.
    """
    from eventstore import CheckpointError, load_private_key, load_public_key

    what = "private key" if private else "public key"
    pem = _read(path, what)
    try:
        (load_private_key if private else load_public_key)(pem)
    except CheckpointError as exc:
        raise CheckpointError(f"{path} is not a usable {what}: {exc}") from None
    return pem


def read_checkpoint(path: Path) -> Checkpoint:
    """A checkpoint file (its signature is checked by ``verify``).

    Raises:
        CheckpointError: missing, unreadable, or not a checkpoint.
    """
    from eventstore import Checkpoint, CheckpointError

    data = _read(path, "checkpoint")
    try:
        return Checkpoint.from_json(data)
    except CheckpointError as exc:
        raise CheckpointError(f"{path} is not a checkpoint: {exc}") from None


def write_checkpoint(path: Path, cp: Checkpoint) -> None:
    """Write a checkpoint to ``PATH.part`` and rename it to ``path`` once complete, so a
    crash never leaves half a checkpoint under the name."""
    part = path.with_name(path.name + ".part")
    try:
        with open(part, "w", encoding="utf-8") as fh:
            fh.write(cp.to_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
