"""Database URLs as people type them: masking secrets and checking the driver.

Masking works on the text itself, field by field, so the rest of the URL is shown
exactly as typed (``sqlite:///:memory:`` stays ``sqlite:///:memory:``). Only the password
of the userinfo and the values of secret query parameters are replaced; the userinfo
may itself contain ``@``, ``:`` or ``/`` when the password was not percent-encoded.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

__all__ = ["mask_url", "quote_password", "SECRET_PARAMS", "SUPPORTED_DRIVERS", "check_driver"]

#: Query parameters whose value is a secret (libpq takes passwords as URI parameters too).
SECRET_PARAMS = frozenset({"password", "sslpassword"})

#: The drivers each backend works with; ``None`` is the bare ``sqlite://`` / ``postgresql://``.
SUPPORTED_DRIVERS = {
    "sqlite": (None, "pysqlite"),
    "postgresql": (None, "psycopg"),
    "postgres": (None, "psycopg"),
}

_MASK = "***"
_SECRET_PARAM = re.compile(r"(?i)([?&;](?:%s)=)[^&;#]*" % "|".join(sorted(SECRET_PARAMS)))


def _userinfo_end(rest: str) -> int:
    """The index of the ``@`` that ends the userinfo of ``rest`` (after ``://``), or -1.

    The userinfo ends at the last ``@`` before the query. When no ``@`` precedes the
    first ``?``, a ``?`` inside an unencoded password is assumed if the text between
    that ``?`` and the next ``@`` holds no ``=`` (it cannot be a query parameter).
    """
    q = rest.find("?")
    if q < 0:
        return rest.rfind("@")
    at = rest.rfind("@", 0, q)
    if at >= 0:
        return at
    nxt = rest.find("@", q)
    if nxt < 0 or "=" in rest[q:nxt]:
        return -1
    q2 = rest.find("?", nxt)
    return rest.rfind("@", 0, q2 if q2 >= 0 else len(rest))


def mask_url(url: str) -> str:
    """``url`` with the password and any secret query parameter replaced by ``***``.

    Everything else is kept as typed. A URL without ``://`` is returned with everything
    up to its last ``@`` masked, since it cannot be told apart.
    """
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        at = text.rfind("@")
        return text if at < 0 else _MASK + text[at:]
    at = _userinfo_end(rest)
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        rest = user + (colon + _MASK if colon else "") + rest[at:]
    return scheme + sep + _SECRET_PARAM.sub(lambda m: m.group(1) + _MASK, rest)


def quote_password(url: str) -> str:
    """``url`` with its password percent-encoded, so that an ``@``, ``/``, ``?`` or ``#``
    typed in a password is read as part of it rather than as the host or the path.

    A password that is already percent-encoded means the same afterwards.
    """
    scheme, sep, rest = str(url).partition("://")
    at = _userinfo_end(rest) if sep else -1
    if at < 0:
        return url
    user, colon, password = rest[:at].partition(":")
    if not colon:
        return url
    return f"{scheme}{sep}{user}:{quote(unquote(password), safe='')}{rest[at:]}"


def check_driver(backend: str, driver: str | None) -> str | None:
    """Why ``backend+driver`` cannot be used, or ``None`` when it can."""
    allowed = SUPPORTED_DRIVERS.get(backend)
    if allowed is None:
        return f"unsupported database {backend!r}; use sqlite:/// or postgresql+psycopg://"
    if driver not in allowed:
        wanted = "postgresql+psycopg:// (psycopg 3)" if backend != "sqlite" else "sqlite:///"
        return f"unsupported driver {driver!r} for {backend}; use {wanted}"
    return None
