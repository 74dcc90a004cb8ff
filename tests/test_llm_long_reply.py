"""A long engineer reply costs seconds, not hours: key masking is linear in the text, JSON extraction is
bounded, and a reply is cut to `MAX_REPLY_CHARS` before it is masked.

The 5 MB case is the real command line (`python -m graph.run --dry-run`) against an OpenAI-compatible server on
127.0.0.1 that answers 5 MB of text shaped to be slow: long runs of letters, of `*`, of `[`, an unclosed
string, thousands of key-shaped tokens."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from env import SIZES
from llm_backends.base import extract_json
from llm_backends.redact import redact

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-proj-Zq8xYv7Wt6Us5Rr4Qp3Lm2"


def _run_bounded(code: str, timeout: float) -> str:
    """Run `code` in a fresh interpreter; a run past `timeout` seconds fails the test (not the session)."""
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout:.0f} s") from None
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def test_masking_is_linear_in_the_text():
    """Each of these 1 MB texts took minutes when masking was quadratic (40,000 letters alone took 15 s)."""
    out = _run_bounded(f"""
        import time
        from llm_backends.redact import redact
        key = {KEY!r}
        texts = {{"letters": "a" * 1_000_000, "stars": "*" * 1_000_000, "bearer": "Bearer " + " " * 1_000_000,
                  "dashes": "-" * 1_000_000, "echoes": "sk-" * 300_000 + "x",
                  "mixed": ("abc***def " + key[3:15] + " ") * 40_000}}
        for name, text in texts.items():
            t0 = time.monotonic()
            redact(text, [key])
            print(name, round(time.monotonic() - t0, 2))
    """, timeout=60)
    times = dict(line.split() for line in out.splitlines())
    assert set(times) == {"letters", "stars", "bearer", "dashes", "echoes", "mixed"}
    assert all(float(t) < 5 for t in times.values()), times


def test_masking_still_masks_keys_fragments_and_shapes():
    text = (f"key {KEY} / part {KEY[5:17]} / echo sk-abc****5678 / abc****5678 / AIzaSyA1b2C3d4E5f6G7h8 / "
            "Authorization: Bearer tok.en/x / ***bold*** / ok")
    out = redact(text, [KEY])
    for gone in (KEY, KEY[5:17], "abc****5678", "AIzaSy", "tok.en"):
        assert gone not in out, gone
    assert out.startswith("key *** / part *** / echo *** / *** / *** / Authorization: *** / ")
    assert out.endswith(" / ok")
    assert redact("a short key k1 stands alone, k10 does not", ["k1"]) == "a short key *** stands alone, k10 does not"


def test_json_extraction_is_bounded_and_never_raises():
    assert extract_json("[" * 200_000) is None  # nested past the decoder's recursion limit: none, no crash
    assert extract_json('{"a": 1} ' + "[" * 100_000) == {"a": 1}
    big = '{"x": "' + "b" * 1_000_000  # an unclosed string, read once
    assert extract_json('{"sizes": {}} ' + "{" * 50_000 + big) == {"sizes": {}}


def hostile_reply(n: int = 5_000_000) -> str:
    """A usable config first, then n characters that used to make masking and extraction quadratic."""
    sizes = {str(s): {"data_ratio": 0.125, "hole_ratio": 0.1, "wait_ratio": 0.25} for s in SIZES}
    head = json.dumps({"sizes": sizes, "rationale": f"my key is {KEY}"})
    body = " ".join(["a" * 1_000_000, "*" * 1_000_000, "[" * 500_000, '{"x": "' + "b" * 500_000, ""])
    filler = ("sk-" + "c" * 40 + " ") * ((n - len(head) - len(body)) // 44)
    return head + " " + body + filler


def test_a_5mb_reply_served_on_localhost_is_cut_and_masked_within_seconds(tmp_path, fake_openai):
    """The run's own command line: `--dry-run` asks the engineer for one proposal and validates it."""
    reply = hostile_reply()
    assert len(reply) > 4_900_000
    fake_openai.default = reply
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(ENGINEER="mylab", ENGINEER_BASE_URL=fake_openai.base_url, ENGINEER_MODEL="fake-model",
               ENGINEER_API_KEY=KEY, PRESET="smoke")
    try:
        p = subprocess.run([sys.executable, "-m", "graph.run", "--dry-run", "--run-dir", str(run_dir)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        raise AssertionError("--dry-run still busy after 240 s with a 5 MB engineer reply") from None
    assert p.returncode == 0, p.stderr[-2000:]
    m = re.search(r"engineer 'mylab' answered in ([0-9.]+)s: a config, accepted", p.stderr)
    assert m, p.stderr[-2000:]
    assert float(m.group(1)) < 30, m.group(0)  # the call, the cut, masking and extraction together
    saved = (run_dir / "dry_run_engineer" / "stage_0" / "engineer_reply.md").read_text()
    assert len(saved) < 200_000 + 2_000  # the cut reply, not 5 MB
    assert '"cut_chars": ' in saved and KEY not in saved and KEY[8:20] not in saved
    assert "my key is ***" in saved
