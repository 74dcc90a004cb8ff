"""The policy's prompt (paper style) and the answer parser.

`render_prompt(instance)` shows the whole map with the legend, one "Agent i needs to go from (r, c) to
(r, c)" line per agent, the rules, the cost convention and the answer format. `parse_plan(text, n)`
reads the answer back: forgiving about spacing and separators, strict about meaning. It never raises;
on bad input it returns a `ParseFailure` saying what was wrong.

Answer format: anything (reasoning) first, then the LAST ``<answer>`` ... ``</answer>`` block holds one
line per agent, ``Agent <i>: (r,c) (r,c) ...``, listing the agent's cell at every time step from its
start to its goal (a repeated cell is a wait). Accepted variations: any case for "agent"/"answer",
missing ``</answer>`` (the block runs to the end), ``(r, c)`` or ``[r, c]``, cells separated by spaces,
commas, ``->``, ``→``, ``;`` or ``|``, a path wrapped over several lines, and blank or prose lines in the
block (lines that neither start with "Agent" nor hold only cells are ignored). Rejected: no answer
block, an agent line with anything but cells and separators, an agent line without cells, an agent
listed twice, agent numbers that are not 0..m-1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .instance import Cell, Instance

START_SYMBOLS = "SsABC"
GOAL_SYMBOLS = "Ggabc"


@dataclass(frozen=True)
class ParseFailure:
    """Why an answer could not be read as a plan."""

    reason: str

    def __bool__(self) -> bool:  # a failure is falsy, a plan (non-empty list) is truthy
        return False


_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
_AGENT = re.compile(r"^\s*[*_#>\-]*\s*agent\s*(\d+)\s*[*_]*\s*[:=]?\s*[*_]*(.*)$", re.IGNORECASE)
_CELL = re.compile(r"[(\[]\s*(-?\d{1,6})\s*(?:[,;]|\s)\s*(-?\d{1,6})\s*[)\]]")
_SEPARATORS = re.compile(r"(?:\s|,|;|\||->|=>|→|-|\.)*")
_SEP_RUN = re.compile(r"(?:\s|,|;|\||->|=>|→|-|\.)+")
_MAX_AGENTS_PARSED = 64
CellSpan = tuple[int, int, int, int]  # a cell's (start, end, row number, column number) offsets in an answer


PROMPT_STYLES = ("full", "compact", "moves")
SMALL_MODEL_STYLES = ("compact", "moves")  # no rules text; chat templates get an empty system prompt (env.library)


def render_prompt(instance: Instance, style: str = "full") -> str:
    """The policy's prompt for one instance (single turn: the model answers with a joint plan).

    `style="full"` (the paper's prompt, the default): the map with its legend, the tasks, the rules, the cost
    convention and the answer format. `style="compact"` (`render_compact_prompt`): the same instance in a
    few lines for small models. `style="moves"` (`render_moves_prompt`): the compact prompt with every ice
    cell's legal moves listed. Any other style raises `ValueError` naming the allowed ones.
    """
    if style == "compact":
        return render_compact_prompt(instance)
    if style == "moves":
        return render_moves_prompt(instance)
    if style != "full":
        raise ValueError(f"prompt style {style!r}: allowed: {', '.join(PROMPT_STYLES)}")
    k = instance.num_agents
    n = instance.size
    cells = [list(row) for row in instance.grid]
    # Goals first, then starts: where a start and another agent's goal share a cell, the start shows.
    for i, (r, c) in enumerate(instance.goals):
        cells[r][c] = GOAL_SYMBOLS[i]
    for i, (r, c) in enumerate(instance.starts):
        cells[r][c] = START_SYMBOLS[i]
    grid = "\n".join(" ".join(row) for row in cells)
    legend = ", ".join(f"{START_SYMBOLS[i]} = start of agent {i}" for i in range(k))
    legend += ", " + ", ".join(f"{GOAL_SYMBOLS[i]} = goal of agent {i}" for i in range(k))
    tasks = _agent_lines(instance, "Agent {i} needs to go from ({sr}, {sc}) to ({gr}, {gc}).")
    example = _agent_lines(instance, "Agent {i}: ({sr},{sc}) ... ({gr},{gc})")
    agents = "agent" if k == 1 else "agents"
    return (
        f"You are a multi-agent path planning expert. There is a {n}x{n} frozen lake map with {k} {agents}:\n"
        f"\n{grid}\n\n"
        f"Legend: F = frozen ice (safe), H = hole (never step on it), {legend}. "
        "Where a start and another agent's goal share a cell, the map shows the start.\n"
        f"Coordinates are 0-indexed (row, col): (0, 0) is the top-left cell, ({n - 1}, {n - 1}) the bottom-right.\n"
        f"\n{tasks}\n\n"
        "Rules:\n"
        "- Time advances in steps. At each step every agent either moves one cell up, down, left or right, "
        "or waits in place.\n"
        "- Agents must stay on the map and never enter a hole.\n"
        "- Two agents may never be in the same cell at the same time, and two agents may never swap cells "
        "in one step.\n"
        "- An agent whose path ends stays on its last cell for ever (it still blocks that cell), so every "
        "path must end on the agent's goal.\n"
        "- Cost: the sum over agents of the step at which each agent reaches its goal for the last time. "
        "Find a plan with the smallest total cost.\n"
        "\n"
        "Answer format: you may think first, then end with an <answer> block holding one line per agent "
        "that lists the agent's cell at every step, from its start to its goal (repeat a cell to wait):\n"
        f"<answer>\n{example}\n</answer>"
    )


def _agent_lines(instance: Instance, template: str) -> str:
    """One line per agent: `template` filled with its index `i`, start `sr, sc` and goal `gr, gc`."""
    return "\n".join(
        template.format(i=i, sr=sr, sc=sc, gr=gr, gc=gc)
        for i, ((sr, sc), (gr, gc)) in enumerate(zip(instance.starts, instance.goals, strict=True))
    )


def render_compact_prompt(instance: Instance) -> str:
    """The same instance as `render_prompt` in a few lines, for small models: the map (rows of ``.`` ice and
    ``H`` holes, no agent symbols), the holes as a coordinate list beside it, each agent's start and goal, and
    the answer format. No rules text: the information is the same, so the task and the verifier are unchanged.

    >>> # Map 3x3, (row,col) from (0,0). Holes: (1,1)
    >>> # Agent 0: (0,0) -> (2,2)
    >>> # ...
    >>> # <answer>
    >>> # Agent 0: (0,0) ... (2,2)
    """
    n = instance.size
    holes = [(r, c) for r, row in enumerate(instance.grid) for c, ch in enumerate(row) if ch == "H"]
    grid = "\n".join("".join("H" if ch == "H" else "." for ch in row) for row in instance.grid)
    hole_text = " ".join(f"({r},{c})" for r, c in holes) if holes else "none"
    tasks = _agent_lines(instance, "Agent {i}: ({sr},{sc}) -> ({gr},{gc})")
    example = _agent_lines(instance, "Agent {i}: ({sr},{sc}) ... ({gr},{gc})")
    return (
        f"Map {n}x{n}, (row,col) from (0,0), H = hole:\n{grid}\nHoles: {hole_text}\n{tasks}\n"
        "Each step every agent moves up, down, left or right, or waits. Never enter a hole or leave the map; "
        "no two agents in one cell or swapping cells. Fewest total steps.\n"
        f"Answer with each agent's cell at every step:\n<answer>\n{example}\n</answer>"
    )


def legal_moves(instance: Instance) -> dict[Cell, list[Cell]]:
    """Every ice cell and the ice cells one move away from it (on the map, not a hole), in reading order: the
    solver's own move table (`env.solver.GridMap`). A wait (staying on the cell) is always legal and is not listed."""
    from .solver import GridMap

    grid = GridMap(instance.grid)
    n = grid.size
    return {divmod(i, n): sorted(divmod(j, n) for j in grid.moves[i] if j != i)
            for i in range(n * n) if grid.free[i]}


def render_moves_prompt(instance: Instance) -> str:
    """The compact prompt with the map's graph beside it: one line per ice cell, ``(r,c): (r,c) (r,c) ...``,
    the cells one legal move away. The same information as the grid, in a form a small model reads by looking
    up the line of the cell it is on (an induction-style copy) instead of working out from the grid where the
    holes are. The instance, the answer format and the verifier are unchanged.

    >>> # ... Holes: (1,1)
    >>> # Moves from each ice cell:
    >>> # (0,0): (0,1) (1,0)
    >>> # (0,1): (0,0) (0,2)
    """
    lines = "\n".join(f"({r},{c}): " + (" ".join(f"({a},{b})" for a, b in nxt) or "none")
                      for (r, c), nxt in legal_moves(instance).items())
    head, sep, tail = render_compact_prompt(instance).partition("\nAgent 0: ")
    return f"{head}\nMoves from each ice cell:\n{lines}{sep}{tail}"


def parse_plan(text: object, n_agents: int) -> list[list[Cell]] | ParseFailure:
    """Read the joint plan from `text`'s last answer block. Never raises.

    Returns one path per listed agent, in agent order (the number of paths may differ from `n_agents`;
    the verifier reports that as ``agent_count``), or a `ParseFailure`.

    >>> parse_plan("I think... <answer>\\nAgent 0: (0,0) -> (0, 1)\\nagent 1: [1,1],[1,0]\\n</answer>", 2)
    [[(0, 0), (0, 1)], [(1, 1), (1, 0)]]
    >>> parse_plan("Agent 0: (0,0)", 1)
    ParseFailure(reason='no <answer> block')
    """
    parsed = parse_plan_spans(text, n_agents)
    return parsed if isinstance(parsed, ParseFailure) else parsed[0]


def parse_plan_spans(text: object, n_agents: int) -> tuple[list[list[Cell]], list[list[CellSpan]]] | ParseFailure:
    """`parse_plan`, with where each cell stands in `text`: (paths, spans), spans[i][t] the character offsets
    (start, end, row, col) of agent i's cell at step t: where it starts and ends, and where its row and its column
    number start. Never raises.

    >>> paths, spans = parse_plan_spans("<answer>\\nAgent 0: (0,0) (0,1)\\n</answer>", 1)
    >>> paths, spans
    ([[(0, 0), (0, 1)]], [[(18, 23, 19, 21), (24, 29, 25, 27)]])
    """
    if not isinstance(text, str):
        return ParseFailure(f"answer is not text ({type(text).__name__})")
    opens = list(_OPEN.finditer(text))
    if not opens:
        return ParseFailure("no <answer> block")
    body_start = opens[-1].end()
    close = _CLOSE.search(text, body_start)
    body = text[body_start : close.start() if close else len(text)]
    paths: dict[int, list[Cell]] = {}
    spans: dict[int, list[CellSpan]] = {}
    current: int | None = None
    at = body_start
    for raw in body.splitlines(keepends=True):
        line_at, at = at, at + len(raw)
        line = raw.strip()
        if not line:
            continue
        line_at += len(raw) - len(raw.lstrip())
        m = _AGENT.match(line)
        if m:
            idx = int(m.group(1)) if len(m.group(1)) <= 3 else 10**6
            if idx in paths:
                return ParseFailure(f"agent {idx} is listed twice")
            if len(paths) >= _MAX_AGENTS_PARSED:
                return ParseFailure(f"more than {_MAX_AGENTS_PARSED} agent lines")
            cells = _cells(m.group(2))
            if isinstance(cells, ParseFailure):
                return ParseFailure(f"agent {idx}: {cells.reason}")
            if not cells:
                return ParseFailure(f"agent {idx}: no cells listed")
            paths[idx] = cells
            spans[idx] = _cell_spans(m.group(2), line_at + m.start(2))
            current = idx
            continue
        if _CELL.search(line):
            cells = _cells(line)
            if current is None:
                return ParseFailure("cells listed before any 'Agent <i>:' line")
            if isinstance(cells, ParseFailure):
                return ParseFailure(f"agent {current}: {cells.reason}")
            paths[current].extend(cells)  # a path wrapped over several lines
            spans[current].extend(_cell_spans(line, line_at))
        # Any other line (prose, a heading) is ignored.
    if not paths:
        return ParseFailure("the answer block has no 'Agent <i>: (r,c) ...' lines")
    ids = sorted(paths)
    if ids != list(range(len(ids))):
        shown = ", ".join(str(i) for i in ids[:8])
        return ParseFailure(f"agents must be numbered 0..{len(ids) - 1} (0-indexed); got {shown}")
    return [paths[i] for i in ids], [spans[i] for i in ids]


def _cell_spans(s: str, offset: int) -> list[CellSpan]:
    return [(offset + m.start(), offset + m.end(), offset + m.start(1), offset + m.start(2)) for m in _CELL.finditer(s)]


def _cells(s: str) -> list[Cell] | ParseFailure:
    found = _CELL.findall(s)
    rest = _CELL.sub(" ", s)  # what is left between and around the cells must be separators only
    if _SEPARATORS.fullmatch(rest) is None:
        bad = _SEP_RUN.sub(" ", rest)
        return ParseFailure(f"unexpected text {bad.strip()[:20]!r} around the cells")
    return [(int(r), int(c)) for r, c in found]
