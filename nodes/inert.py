"""Untrusted text made inert where it is shown.

The engineer is the policy under training or a remote API: its rationale, errors quoting its reply and
anything derived from them are untrusted. Before such text reaches

- a terminal (`graph.run`'s progress lines, the `--approve` prompt): `for_terminal` removes control
  characters (ANSI escape sequences such as clear-screen or a title change, C1 controls, bidirectional
  overrides), keeping newlines and tabs;
- report.md: `for_markdown` also escapes HTML (`<script>`, `<img onerror=...>` become text), neutralises
  headings (`# ...`, and setext underlines) so a reply cannot fake a section, and keeps images from
  loading (`![..](url)` becomes text).
"""

from __future__ import annotations

import html
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
    """`text` safe to place in report.md: terminal-clean, HTML escaped, no headings, no image loads.

    >>> for_markdown("# Fake\\n<script>x()</script> ![i](http://e/x.png)")
    '\\\\# Fake\\n&lt;script&gt;x()&lt;/script&gt; !\\\\[i](http://e/x.png)'
    """
    text = html.escape(for_terminal(text), quote=False)
    text = _HEADING.sub(r"\1\\\2", text)
    text = _SETEXT.sub(r"\1\\\2", text)
    return text.replace("![", "!\\[")


def md_inline(text: str) -> str:
    """`for_markdown` on one line (newlines become spaces): for table cells and sentences."""
    return for_markdown(" ".join(str(text).splitlines())).replace("|", "\\|")
