"""What a psycopg error means to eventstore: retryable, a taken version or event id, no schema, or other."""

from __future__ import annotations

import re

import psycopg
import psycopg.errors

from eventstore.storage.sql import ErrorKind

__all__ = ["classify"]

# A partition's copies of the events' keys get names of PostgreSQL's choosing.
_PARTITION_PK = re.compile(r"events_p\d+_pkey")
_PARTITION_EVENT_ID = re.compile(r"events_p\d+_session_pk_event_id_idx")


_RETRYABLE = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.AdminShutdown,
    psycopg.errors.CannotConnectNow,
    psycopg.OperationalError,
)


# libpq reports these at connect time as a plain OperationalError (often without a
# SQLSTATE), so they are recognised by SQLSTATE class 28 / 3D000 or by libpq's wording.
_CONFIG_ERRORS = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    # a malformed connection parameter of the URL (?sslmode=bogus, a port out of range)
    "invalid connection option",
    "invalid port number",
    "invalid integer value",
    "bad value for",
)
_INVALID_VALUE = re.compile(r"invalid \w+ value")


def _is_config_error(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate.startswith("28") or sqlstate == "3D000":
        return True
    text = str(exc)
    return any(phrase in text for phrase in _CONFIG_ERRORS) or bool(_INVALID_VALUE.search(text))


def classify(orig: BaseException | None, invalidated: bool) -> ErrorKind:
    """Decide what a driver error means (see :class:`~eventstore.storage.sql.ErrorKind`)."""
    if isinstance(orig, psycopg.errors.UniqueViolation):
        constraint = getattr(orig.diag, "constraint_name", None) or ""
        if constraint == "pk_events" or _PARTITION_PK.fullmatch(constraint):
            return ErrorKind.VERSION_TAKEN
        if constraint == "ix_events_session_pk_event_id" or _PARTITION_EVENT_ID.fullmatch(
            constraint
        ):
            return ErrorKind.EVENT_ID_TAKEN
        return ErrorKind.OTHER
    if isinstance(orig, psycopg.errors.UndefinedTable):
        return ErrorKind.NO_SCHEMA
    if isinstance(orig, psycopg.errors.ProgramLimitExceeded) and not invalidated:
        # e.g. "index row requires N bytes": an OperationalError, yet a retry never helps.
        return ErrorKind.OTHER
    if isinstance(orig, psycopg.OperationalError) and _is_config_error(orig):
        # A wrong password, user or database fails the same way on every try.
        return ErrorKind.OTHER
    if invalidated or isinstance(orig, _RETRYABLE):
        return ErrorKind.RETRYABLE
    return ErrorKind.OTHER
