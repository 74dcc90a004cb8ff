"""The cores of the test session before a parallel worker kept its share (tests/conftest.py `_pin_worker`), for the
few tests that must run something across several cores."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def all_cores() -> list[int]:
    """Every core the test session may use (a parallel worker's own share is narrower)."""
    given = os.environ.get("TESTS_ALL_CORES")
    return [int(c) for c in given.split(",")] if given else sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def on_all_cores() -> Iterator[None]:
    """This process (and what it starts) on every core of the session for the block, then back on its share."""
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, all_cores())
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)
