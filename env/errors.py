"""The solver's two failures, shared by `env.solver` and `env.cbs`."""


class SolverBudgetExceeded(RuntimeError):
    """The search hit its node budget before proving an optimum."""


class Unsolvable(ValueError):
    """The instance has no conflict-free plan (e.g. a goal unreachable, or a corridor no one can pass)."""
