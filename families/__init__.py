"""Task families: everything the loop knows about a task's levers, between the trainer (`trainer/task.py`, a
`Task`) and the graph's nodes (`nodes/`), which reach a family only through `families/base.py` `LoopFamily`.

`family_of` is the one place that picks it. The registry of built-in tasks names MAPF-FrozenLake's family
(`families/mapf.py`); any other task name is loaded by `trainer.task.load_task` and served by the family its task
names in `loop_family` (one line in the task's class: `tests/test_family_shape.py`'s scalar family), else by the
level-share family (`families/level_share.py`: reasoning-gym, `tests/support/toy_task.py`, your own).
"""

from __future__ import annotations

import functools

from families.base import LoopFamily, Settings
from trainer.task import load_task

# The registry of built-in tasks with a family of their own: task name -> the family's class (module:Class)
BUILT_IN = {"mapf": "families.mapf:MapfFamily"}
DEFAULT_TASK = "mapf"  # the paper's testbed, MAPF-FrozenLake

__all__ = ["BUILT_IN", "DEFAULT_TASK", "LoopFamily", "family_of"]


def family_of(settings: Settings | str) -> LoopFamily:
    """The run's task family: from its settings (`settings.task`) or a task name. A name of `BUILT_IN` is that
    family; any other is loaded by `trainer.task.load_task` and served by its `loop_family` (else level shares,
    `LevelShareFamily`). An unknown name, or a task that lacks a member its family needs, raises `ValueError` in
    one line saying what is allowed."""
    return _family_named(settings if isinstance(settings, str) else settings.task)


@functools.lru_cache(maxsize=16)
def _family_named(name: str) -> LoopFamily:
    import importlib

    if name in BUILT_IN:
        module, _, cls = BUILT_IN[name].partition(":")
        return getattr(importlib.import_module(module), cls)()
    from families.level_share import LevelShareFamily

    task = load_task(name)
    return getattr(task, "loop_family", LevelShareFamily)(task, name)
