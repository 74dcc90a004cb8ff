"""MAPF-FrozenLake: a multi-agent path-finding testbed for LLM reasoning (the rulebook).

ENV_VERSION = "1.1.0"

Description
    A square frozen lake of size 3..10 with ice cells (``F``) and holes (``H``). 1 to 5 agents each
    have a start and a goal (starts distinct, goals distinct; a start may sit on another agent's goal).
    The task is single-turn: given the whole map, write a conflict-free joint plan that brings every
    agent to its goal at the smallest sum of costs. Every instance is generated with a proven-optimal
    plan (`env.solver`): joint-state A* for 2 agents, CBS with a space-time A* low level for more.

Actions
    Lock-step time. At each step every agent moves one cell up, down, left or right, or waits.
    Forbidden: leaving the map, entering a hole, two agents in one cell at one time (vertex conflict),
    two agents swapping cells in one step (edge conflict). An agent whose path has ended waits on its
    last cell for ever and still blocks it. Cost of an agent: the step at which it reaches its goal for
    the last time; cost of a plan: the sum over agents (sum of costs). `needs_wait`: the optimal sum of
    costs exceeds the sum of the agents' independent shortest distances.

Observation (prompt)
    `render_prompt(instance)`: "You are a multi-agent path planning expert. There is a NxN frozen lake
    map with K agents:", the map with one symbol per cell (``F`` ice, ``H`` hole, starts ``S s A B C``
    and goals ``G g a b c`` for agents 0..4; where a start and another agent's goal share a cell the
    start is shown), 0-indexed ``(row, col)`` coordinates, "Agent i needs to go from (r, c) to (r, c)."
    per agent, the rules above and the answer format. For small models, `render_prompt(instance, "compact")`:
    the map as rows of ``.`` and ``H``, the holes as a coordinate list, each agent's start and goal and the
    answer format, no rules text; and `"moves"`: the compact prompt with one line per ice cell listing the
    cells one legal move away (`env.prompt.legal_moves`), so a plan can be written by looking up the line of the cell an
    agent is on. The same instance and verifier in every style.

Answer format
    Anything first (reasoning), then the last ``<answer>`` ... ``</answer>`` block with one line per
    agent, ``Agent <i>: (r,c) (r,c) ...``: the agent's cell at every step from its start to its goal,
    a repeated cell being a wait. `parse_plan` is forgiving about spacing, brackets and separators
    (spaces, commas, ``->``), and strict about meaning (see `env.prompt`).

Rewards
    R = w_acc * R_acc + w_len * R_len (`env.reward`). R_acc = 0 unless valid; else with
    c = cost - optimal, c_max = 2 * optimal: 1.0 (c = 0), 1 - 0.7 c / c_max (0 < c <= c_max), 0.3
    (c > c_max). R_len = 0 up to 1500 tokens, linear to -1 at 4096, -1 beyond. (w_acc, w_len) goes
    from (0.5, 0.5) to (0.8, 0.2) as the running share of answers <= 1500 tokens rises from 0.5 to 0.9
    (`RewardState`, an EMA over batches, saved and restored with the run).

Validity checks
    `verify(instance, text)` runs 8 checks; `FAILURES` lists them in the paper's order (parse_error,
    illegal_move, conflict, goal_not_reached, wrong_start, agent_count, hole, out_of_bounds). They are
    evaluated in the order parse_error, agent_count, wrong_start, out_of_bounds, hole, illegal_move,
    goal_not_reached, conflict (`CHECK_ORDER`), and the first failing one is the verdict's `failure`.
    Optimal = valid and at the optimum of the chosen criterion (`verify(..., criterion=)`): ``soc`` (the
    default: sum of costs, cost == optimal_cost, the stored plan's optimum) or ``makespan`` (the paper's
    "makespan-optimal": makespan == optimal_makespan; the loop's default, `train.optimality`). Every
    verdict carries both optima and both of the plan's figures.

Version history
    1.0.0  first release: 8 sizes, 1-5 agents, sum of costs with agents staying on goals, the answer
           format above, the paper's reward; benchmark splits val, val-mini, test, test-mini.
    1.1.0  the paper's held-out protocol: ``test`` keeps the paper's cells (3,150; size >= agents), the other
           450 move to ``test-extra``, ``test-mini`` follows (63), ``test-cpu`` is new; every instance stores
           its optimal makespan (`optimal_makespan`) beside its optimal sum of costs; verdicts and the reward
           take an optimality criterion (sum of costs by default; the loop's rewards, evaluations and tables
           use the makespan by default).
"""

from .benchmark import list_splits, load_split
from .config import (
    SIZES,
    EnvConfig,
    SizeKnobs,
    max_hole_ratio,
    project,
    random_config,
    restrict_sizes,
    uniform_config,
)
from .generator import Generated, generate, make_instance
from .instance import Instance, read_jsonl, write_jsonl
from .library import LengthAwareReward, create_dataset, mapf_reward, score_answer, score_answers, to_dataset
from .prompt import PROMPT_STYLES, ParseFailure, parse_plan, render_compact_prompt, render_prompt
from .reward import RewardState, accuracy_reward, length_reward, total_reward
from .solver import Plan, SolverBudgetExceeded, Unsolvable, solve
from .verify import CHECK_ORDER, FAILURES, Verdict, plan_text, verify

ENV_VERSION = "1.1.0"

__all__ = [
    "CHECK_ORDER",
    "ENV_VERSION",
    "FAILURES",
    "SIZES",
    "EnvConfig",
    "Generated",
    "Instance",
    "LengthAwareReward",
    "ParseFailure",
    "Plan",
    "RewardState",
    "SizeKnobs",
    "SolverBudgetExceeded",
    "Unsolvable",
    "Verdict",
    "accuracy_reward",
    "create_dataset",
    "generate",
    "length_reward",
    "list_splits",
    "load_split",
    "make_instance",
    "mapf_reward",
    "max_hole_ratio",
    "parse_plan",
    "plan_text",
    "project",
    "random_config",
    "restrict_sizes",
    "read_jsonl",
    "render_prompt",
    "render_compact_prompt",
    "score_answer",
    "score_answers",
    "PROMPT_STYLES",
    "solve",
    "to_dataset",
    "total_reward",
    "uniform_config",
    "verify",
    "write_jsonl",
]
