"""Keep secrets out of what a run writes: API keys in model replies, credentials in URLs.

- `secrets_from_env(env)`: the values of every `*_API_KEY`, `*_TOKEN`, `*_SECRET` variable (8+ characters),
  the keys an engineer reply could echo.
- `redact(text, secrets)`: `text` with each secret, any run of 8+ of its characters, and anything shaped
  like a key (`sk-...`, `AIza...`, `Bearer ...`, a server's masked echo `sk-abc****5678`) replaced by `***`.
  `OpenAIChat` passes its error messages through it; `nodes.propose_config` passes every engineer reply
  through it before the reply is written (engineer_reply.md, validation.json, the graph state).
- `mask_url(url)`: `https://user:***@host/...?key=***` for a URL with credentials or a query (settings.json,
  log lines, errors).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

SECRET_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET")
MASK = "***"

# Every pattern below runs in time linear in the text: a match can only start where a run of its characters
# starts (a lookbehind), and runs are consumed possessively, so no position is scanned twice. (The earlier
# `[A-Za-z0-9_\-]*\*{3,}...` scanned the rest of a run from every position of it: 40,000 letters took 15 s.)
_WORD = r"A-Za-z0-9_\-"
_TOKEN = re.compile(rf"(?<![{_WORD}])[{_WORD}]{{8,}}+")
# a run of key characters and `*`: a masked echo (`sk-abc****5678`) is such a run with `***` before a key character
_STARRED_RUN = re.compile(rf"(?<![{_WORD}*])[{_WORD}*]++")
_STARRED = re.compile(rf"\*{{3}}[{_WORD}]")
_KEY_LIKE = re.compile(
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-*.]{3,}+"
    r"|\bAIza[A-Za-z0-9_\-*]{8,}+"
    r"|(?i:bearer)\s++\S++"
)


def secrets_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of the secret-looking variables of `env` (default `os.environ`), longest first."""
    env = os.environ if env is None else env
    found = {v.strip() for k, v in env.items() if k.upper().endswith(SECRET_SUFFIXES) and len(v.strip()) >= 8}
    return sorted(found, key=len, reverse=True)


def _fragments(secret: str) -> re.Pattern:
    """Any 8 consecutive characters of `secret`, as one pattern (searched inside a token, at C speed)."""
    windows = sorted({secret[i : i + 8] for i in range(len(secret) - 7)})
    return re.compile("|".join(map(re.escape, windows)))


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` without the given secrets (default: `secrets_from_env()`), fragments of them, or key shapes.
    Linear in the length of `text` (a 5 MB text takes about a second).

    >>> redact("my key is sk-live-abcdefgh1234 ok", [])
    'my key is *** ok'
    >>> redact("echo: 0123456789abcdef!", ["0123456789abcdef"])
    'echo: ***!'
    >>> redact("masked echo: abc****5678.", [])
    'masked echo: ***.'
    """
    if not text:
        return text
    secrets = secrets_from_env() if secrets is None else list(secrets)
    for secret in secrets:
        if not secret:
            continue
        if len(secret) >= 8:
            text = text.replace(secret, MASK)
            frag = _fragments(secret)
            text = _TOKEN.sub(lambda m, f=frag: MASK if f.search(m[0]) else m[0], text)
        else:  # a short key: mask it where it stands as a token of its own, not inside other words
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", MASK, text)
    text = _KEY_LIKE.sub(MASK, text)
    return _STARRED_RUN.sub(lambda m: MASK if _STARRED.search(m[0]) else m[0], text)


def mask_url(url: str | None) -> str | None:
    """`url` with its password (and a user given alone, often a token) and every query value replaced by
    `***` (a query often carries the key: `?api_key=...`, `?key=...`, a signed URL's `sig=...`).

    >>> mask_url("https://me:pw@host:8000/v1")
    'https://me:***@host:8000/v1'
    >>> mask_url("http://127.0.0.1:8000/v1?api_key=abc&api-version=1")
    'http://127.0.0.1:8000/v1?api_key=***&api-version=***'
    >>> mask_url("http://127.0.0.1:8000/v1")
    'http://127.0.0.1:8000/v1'
    """
    if not url or not any(c in url for c in "@?#"):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, sep, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if sep else f"{MASK}@{host}"
    query = "&".join(_mask_param(p) for p in parts.query.split("&")) if parts.query else ""
    fragment = MASK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _mask_param(param: str) -> str:
    name, sep, _ = param.partition("=")
    return f"{name}={MASK}" if sep else (MASK if name else "")


def split_query(url: str) -> tuple[str, dict[str, str]]:
    """(`url` without its query and fragment, the query's parameters): what an HTTP client takes as a base URL
    and as parameters sent with every request (`OpenAIChat`), so that a path is never appended to a query.

    >>> split_query("http://h/v1?api_key=k&x=1")
    ('http://h/v1', {'api_key': 'k', 'x': '1'})
    """
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), params


def has_masked_credentials(url: str | None) -> bool:
    """True for a URL `mask_url` masked (its credentials or query values are not in it any more)."""
    if not url or mask_url(url) != url:
        return False
    parts = urlsplit(url)
    return f"{MASK}@" in parts.netloc or MASK in parts.query or parts.fragment == MASK
