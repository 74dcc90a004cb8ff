"""Untrusted text made inert where it is shown.

The engineer is the policy under training or a remote API: its rationale, errors quoting its reply and
anything derived from them are untrusted. Before such text reaches

- a terminal (`graph.run`'s progress lines, the `--approve` prompt): `for_terminal` removes control
  characters (ANSI escape sequences such as clear-screen or a title change, C1 controls, bidirectional
  overrides), keeping newlines and tabs;
- report.md: `for_markdown` also escapes HTML (`<script>`, `<img onerror=...>` become text), neutralises
  headings (`# ...`, and setext underlines) so a reply cannot fake a section, and makes every link and
  image text (`[..](javascript:...)` and `![..](url)` are shown, never followed or loaded).

An engineer reply is made inert once, where it enters the run (`inert_reply`, in propose_config, before
anything is written): API keys redacted, control characters removed, `<` and `>` written as `&lt;` and
`&gt;`. Every file of the run (engineer_reply.md, validation.json, graph.sqlite, report.md) and the
terminal then only ever see that text. Only `<` and `>` are escaped (not `&`), so text escaped once is not
escaped again by `for_markdown` and reads the same in report.md.
"""

from __future__ import annotations

import re

# a whole ANSI escape sequence first (so its parameters do not survive as text), then any other control
# character except \t and \n, C1 controls, and the Unicode bidirectional controls
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def for_terminal(text: str) -> str:
    """`text` without escape sequences and control characters (newlines and tabs kept; `\\r` removed).

    >>> for_terminal("ok\\x1b[2J\\x1b]0;owned\\x07 done\\r")
    'ok done'
    """
    return _CONTROL.sub("", _ANSI.sub("", str(text)))


_HEADING = re.compile(r"^(\s{0,3})(#)", re.M)
_SETEXT = re.compile(r"^(\s{0,3})([=-])(?=[=\-\s]*$)", re.M)


def for_markdown(text: str) -> str:
    """`text` safe to place in report.md: terminal-clean, HTML escaped, no headings, no links or images (every
    `[` escaped, and every backslash, so that none can undo an escape): a `[x](javascript:...)` is text.

    >>> for_markdown("# Fake\\n<script>x()</script> ![i](http://e/x.png) [a](javascript:alert(1))")
    '\\\\# Fake\\n&lt;script&gt;x()&lt;/script&gt; !\\\\[i](http://e/x.png) \\\\[a](javascript:alert(1))'
    """
    text = _html(for_terminal(text)).replace("\\", "\\\\").replace("[", "\\[")
    text = _HEADING.sub(r"\1\\\2", text)
    return _SETEXT.sub(r"\1\\\2", text)


def _html(text: str) -> str:
    """No HTML tag can open: `<` and `>` as entities (`&` is left alone: it opens no tag)."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def inert_reply(text: str) -> str:
    """An engineer reply as the run keeps it: keys redacted (`llm_backends.redact`), no control characters, no HTML
    tags. JSON in it still decodes (the escapes change only the insides of strings).

    >>> inert_reply('{"rationale": "<b>hi</b>\\x1b[2J"}')
    '{"rationale": "&lt;b&gt;hi&lt;/b&gt;"}'
    """
    from llm_backends.redact import redact

    return _html(for_terminal(redact(text)))


MAX_DEPTH = 40  # a config needs 3 levels; deeper containers of a decoded reply are dropped


def inert_value(obj):
    """`inert_reply` on every string (and key) inside a decoded JSON value: JSON escapes (`\\u001b`, a key
    spelled with `\\u` escapes) decode to what the raw-text pass could not see. A container nested deeper
    than MAX_DEPTH levels becomes a placeholder string."""

    def walk(x, depth: int):
        if isinstance(x, str):
            return inert_reply(x)
        if isinstance(x, dict | list) and depth >= MAX_DEPTH:
            return f"[{type(x).__name__} nested deeper than {MAX_DEPTH} levels: dropped]"
        if isinstance(x, dict):
            return {walk(k, depth) if isinstance(k, str) else k: walk(v, depth + 1) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, depth + 1) for v in x]
        return x

    return walk(obj, 0)


def md_inline(text: str) -> str:
    """`for_markdown` on one line (newlines become spaces): for table cells and sentences."""
    return for_markdown(" ".join(str(text).splitlines())).replace("|", "\\|")
