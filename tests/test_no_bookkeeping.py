"""No project bookkeeping in the tree: the repository speaks to its users, so no tracked text file (code,
`--help` texts, docs, tests, results READMEs) refers to the project's work items by number ("issue" or "stop"
or "deliver" or "session" followed by a number), or to a machine by a nickname (a CPU family fused with a number): a machine is named by
what it is ("a 2-core Xeon with AMX"). Git history keeps that record. Counts in prose stay legal: "stops 1 of 8
short", "stop 3 steps early"; so do CPU names ("AMD EPYC Zen 4")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A work item by number: the word, an optional '#', a number or a range of them, not followed by what makes
# the number a count ("of 8", "steps", "tokens", ...). Spelled in pieces so that this file does not match itself.
_COUNT = r"(?:of\s+\d|steps?\b|tokens?\b|times?\b|answers?\b|requests?\b|calls?\b|seconds?\b|s\b|min\b|minutes?\b" \
         r"|short\b|early\b|agents?\b|cells?\b|points?\b|characters?\b|lines?\b)"
BOOKKEEPING = re.compile(
    r"\b(?:iss" r"ues?|deli" r"ver(?:ables?)?|sess" r"ions?|st" r"ops?)(?:\s+#?|\s*#\s*)\d+\b(?:\s*[-–]\s*\d+\b)?"
    rf"(?!\s+{_COUNT})",
    re.IGNORECASE,
)
# a machine's nickname: a CPU family fused with a number, in lower case; "Zen 4" is the name of a CPU
NICKNAME = re.compile(r"\b(?:ze" r"n|xe" r"on|ep" r"yc|am" r"x|am" r"d)-?\d\b")


def tracked_text_files() -> dict[str, str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    texts = {}
    for rel in (p for p in out.decode().split("\0") if p):
        try:
            texts[rel] = (REPO / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # binary files (PNGs, archives), or a file deleted in the working tree
    return texts


def hits(text: str) -> list[tuple[int, str]]:
    """(line, match) for every hit; a match may run over a line break, as in a wrapped comment."""
    found = [*BOOKKEEPING.finditer(text), *NICKNAME.finditer(text)]
    return sorted((text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split())) for m in found)


def test_the_pattern_catches_bookkeeping_and_leaves_counts_alone():
    word = {"i": "iss" "ue", "s": "st" "op", "d": "Deli" "ver", "e": "sess" "ion"}
    caught = [f"({word['i']} 16)", f"before {word['i']} #20, point 8", f"{word['s'].title()} 48's first rule",
              f"(evals/results/learning_cpu, {word['s']}s 48-49)", f"since {word['s']} 62 a decode step",
              f"{word['d']} 5", f"{word['e']} 12", f"(2 seeds, {word['s']}\n    # 60)",
              f"the first arm since {word['s']} 31 of which", f"{word['i']}s 3-4"]
    for text in caught:
        assert BOOKKEEPING.search(text), text
    legal = [f"# {word['s']}s 1 of 8 short", f"{word['s']} 3 steps early", f"it {word['s']}s 2 tokens later",
             f"{word['s']}_after_steps", "the next stage", f"a known {word['i']} in vLLM", f"{word['d']} the reply"]
    for text in legal:
        assert not BOOKKEEPING.search(text), text
    assert hits("a 2-core " + "ze" "n3 box") and not hits("a 2-core AMD EPYC Zen 4 (AVX-512 BF16), amx_bf16")


def test_no_tracked_text_file_names_a_work_item_by_number():
    found = [f"{rel}:{n}: {what}" for rel, text in sorted(tracked_text_files().items()) for n, what in hits(text)]
    assert not found, "bookkeeping words (say what changed and why, not which work item):\n" + "\n".join(found)
