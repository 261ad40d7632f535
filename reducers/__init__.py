"""Pure folds of the log into projections. No I/O, no clock, no randomness."""

from reducers.fold import fold, skip
from reducers.state import AgentRow, LeaseRow, ProxyKey, ProxyRow, SourceRow, State

__all__ = ["AgentRow", "LeaseRow", "ProxyKey", "ProxyRow", "SourceRow", "State", "fold", "skip"]
