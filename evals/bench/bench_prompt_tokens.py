"""The engineer's prompt in tokens: the system prompt and the user message of each family's pinned prompt
(tests/golden/prompts/, rendered by `python -m tests.support.golden_prompts`), counted with the embedded model's
tokenizer (SmolLM2-135M; other tokenizers count within a few percent of it on this text).

Run:  python evals/bench/bench_prompt_tokens.py [FILE.md ...]   (default: every file of tests/golden/prompts)

Prints one row per file: the characters and tokens of its system prompt, of its user message, and in all. Give
the files of another tree (a prompt rendered before a change) beside them to compare.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="prompt files with '# system' and '# user' parts")
    args = ap.parse_args(argv)
    files = args.files or sorted((ROOT / "tests" / "golden" / "prompts").glob("*.md"))
    if not files:
        ap.error("no prompt file given, and tests/golden/prompts holds none")
    from transformers import AutoTokenizer

    from llm_backends.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model())
    print(f"{'file':<40} {'system chars':>12} {'tokens':>7} {'user chars':>10} {'tokens':>7} {'all tokens':>10}")
    for f in files:
        text = f.read_text()
        if "\n# user\n" not in text:
            ap.error(f"{f}: no '# user' heading: not a rendered prompt (python -m tests.support.golden_prompts)")
        system, user = text.split("\n# user\n", 1)
        ns, nu = (len(tok(t, add_special_tokens=False)["input_ids"]) for t in (system, user))
        print(f"{str(f)[-40:]:<40} {len(system):>12} {ns:>7} {len(user):>10} {nu:>7} {ns + nu:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
