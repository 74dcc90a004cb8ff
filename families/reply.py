"""Reading an engineer's reply, for every family: the bounded JSON scan that finds the proposal in it.

A family says which object is a proposal (`Shape`: the key that holds its levers, `sizes` or `levels`, and the
keys that mark a bare object of them, a grid size or a level number). The reply is parsed once: the JSON object the
chat backend decoded (`ChatResult.parsed`, when a json_schema was asked for) is the proposal's source when there is
one. Otherwise the extraction is tolerant: the whole reply as JSON, else code-fenced JSON, else the first balanced
`{...}` that decodes (an object with the family's keys is preferred), trailing commas forgiven; a bare
`{"3": ..., ...}` is wrapped as `{"<key>": ...}`; a string `rationale` key is taken out of the object, otherwise
prose around the JSON serves as the rationale. When nothing usable is found the proposal is None and the reason
is returned, which validate_config sends back to the engineer.

Extraction is bounded and never raises: a reply is cut to its first `MAX_REPLY_CHARS` (200,000) characters
before anything reads it, at most `MAX_DECODE_STARTS` positions are tried, and JSON nested too deeply for the
decoder (a `RecursionError`) counts as not decoding.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_RATIONALE_CHARS = 2000
MAX_REPLY_CHARS = 200_000  # longer replies are cut to this before extraction (bounded work and memory)
MAX_DECODE_STARTS = 400  # bounded work on huge replies: at most this many '{' positions are tried
MAX_BALANCED_SCANS = 20  # ... and at most this many are re-read with trailing commas removed


@dataclass(frozen=True)
class Shape:
    """What marks a family's proposal in a reply: the key holding its levers (`sizes`, `levels`), the keys of a
    bare object of them (`"3"`..`"10"`, the level numbers), and the word for one such key (`size`, `level`)."""

    key: str
    bare_keys: frozenset[str]
    word: str


@dataclass
class Extracted:
    """What `read_reply` found: the config object (or None), a rationale, the reason when None."""

    config: dict | None
    rationale: str = ""
    error: str | None = None
    notes: list[str] = field(default_factory=list)


_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.S)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_DECODER = json.JSONDecoder()


# What decoding a reply can raise: malformed JSON (ValueError) or nesting deeper than the decoder's
# recursion limit (RecursionError, e.g. '{"a":' repeated 25,000 times).
_DECODE_ERRORS = (ValueError, RecursionError)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except _DECODE_ERRORS:
        pass
    try:
        return json.loads(_TRAILING_COMMA.sub(r"\1", text))
    except _DECODE_ERRORS:
        return None


def _is_proposal(obj: Any, shape: Shape) -> bool:
    return isinstance(obj, dict) and (shape.key in obj or bool(shape.bare_keys & {str(k) for k in obj}))


def _candidates(text: str, shape: Shape):
    """(object, start, end) candidates in order of trust: whole text, fenced blocks, balanced objects."""
    stripped = text.strip()
    obj = _loads(stripped)
    if obj is not None:
        yield obj, 0, len(text)
    for m in _FENCE.finditer(text):
        obj = _loads(m.group(1).strip())
        if obj is not None:
            yield obj, m.start(), m.end()
    tried = scans = 0
    i = text.find("{")
    while i != -1 and tried < MAX_DECODE_STARTS:
        tried += 1
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except _DECODE_ERRORS:
            obj, end = None, i
            scans += 1
            close = _balanced_end(text, i) if scans <= MAX_BALANCED_SCANS else None
            if close is not None:
                obj = _loads(text[i:close])
                end = close if obj is not None else i
        if obj is not None:
            yield obj, i, end
            i = text.find("{", max(end, i + 1)) if _is_proposal(obj, shape) else text.find("{", i + 1)
        else:
            i = text.find("{", i + 1)


def _balanced_end(text: str, start: int, limit: int = 200_000) -> int | None:
    """Index after the `}` closing the `{` at `start` (string-aware), or None when it never closes."""
    depth, in_str, esc = 0, False, False
    for j in range(start, min(len(text), start + limit)):
        ch = text[j]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def read_reply(text: str, shape: Shape, finish_reason: str | None = None, parsed: Any = None) -> Extracted:
    """The config object (the family's `shape`) and rationale in an engineer's reply, tolerant of fences and prose.

    `parsed` is the JSON the chat backend already decoded from the reply (`ChatResult.parsed`, when a
    json_schema was asked for): when it is an object it is the only candidate, so the reply is parsed once;
    the prose around the reply's outermost braces then serves as the rationale when it has no key for one.

    >>> sizes = Shape("sizes", frozenset({"3"}), "size")
    >>> e = read_reply('Here: ```json\\n{"sizes": {}, "rationale": "why"}\\n``` ok', sizes)
    >>> e.config, e.rationale
    ({'sizes': {}}, 'why')
    >>> read_reply("no idea", sizes).error
    'no JSON object in the reply (7 characters)'
    """
    text = text or ""
    notes: list[str] = []
    cut = len(text) - MAX_REPLY_CHARS
    if cut > 0:
        text = text[:MAX_REPLY_CHARS]
        notes.append(f"the reply was cut to its first {MAX_REPLY_CHARS} characters ({cut} more not read)")
    first_dict: tuple[dict, int, int] | None = None
    found: tuple[dict, int, int] | None = None
    if isinstance(parsed, dict):
        start, end = text.find("{"), text.rfind("}") + 1
        candidates = iter([(parsed, start, end) if 0 <= start < end else (parsed, 0, len(text))])
    else:  # no JSON object from the backend (no schema asked, or a fake): the tolerant scan of the text
        candidates = _candidates(text, shape)
    for obj, start, end in candidates:
        if _is_proposal(obj, shape):
            found = (obj, start, end)
            break
        if isinstance(obj, dict) and first_dict is None:
            first_dict = (obj, start, end)
    if found is None:
        if first_dict is not None and isinstance(first_dict[0].get("config"), dict):
            found = (first_dict[0]["config"], first_dict[1], first_dict[2])
            notes.append("took the config from a 'config' key")
        else:
            first_brace = text.find("{")
            if first_dict is not None and first_dict[1] == first_brace:
                keys = ", ".join(sorted(map(str, first_dict[0])))[:200]
                why = f"the JSON object in the reply has no '{shape.key}' (keys: {keys})"
            elif first_brace != -1:
                why = (
                    f"the JSON in the reply does not decode (truncated or malformed; {len(text)} characters)"
                )
            else:
                why = f"no JSON object in the reply ({len(text)} characters)"
            if finish_reason == "length":
                why += "; the reply was cut at the token limit: answer with the JSON object only"
            if cut > 0:
                why += f"; only the first {MAX_REPLY_CHARS} of its {MAX_REPLY_CHARS + cut} characters were read"
            return Extracted(None, error=why, notes=notes)
    obj, start, end = found
    obj = dict(obj)
    if shape.key not in obj:
        obj = {shape.key: obj}
        notes.append(f"wrapped a bare {shape.word}-keyed object as {{'{shape.key}': ...}}")
    rationale = obj.pop("rationale", None)
    if not isinstance(rationale, str):
        if rationale is not None:
            obj["rationale"] = rationale  # not a string: leave it for validation to report
        rationale = (text[:start] + " " + text[end:]).strip()
        rationale = re.sub(r"```[a-zA-Z]*", "", rationale).strip()
    return Extracted(obj, rationale=rationale[:MAX_RATIONALE_CHARS].strip(), notes=notes)
