"""`FairShare14` ("fairshare-14"): `fairshare-13` with a moment's victim-search budget carried
into one cycle.

Pure: a policy is a config value (`schemas.policy.FairShare14Config` plus its version); its
methods are functions of their arguments. Everything not named here is `FairShare13`'s
(ledger/dispatch/fairshare13.py); `fairshare-13` and older keep their code exactly (replay).

Why: a cycle runs at most `search_budget` (32) victim searches. When they ran out after the
cycle appended, the simulator (`kernel.drive`, `runner`, `whatif`) cycled again at once, at the
same `now`, up to 4 times: at 4,096 GPUs 27% of the cycles of a day with a long queue
(docs/simulation.md, "Speed, tenth round"). Each such cycle takes the snapshot, the ranks and the
order again, forgets the cycle's memo of failed searches and spends its budget again on the
same jobs at the head of the order before reaching new ones.

What changes: the cycle itself carries on. When a budget (`Policy.budget_of`: fair share's and
the debug lane's, each on its own) has run out and the cycle placed or preempted since it was
last renewed, it is renewed (`engine._Cycle._renew`), at most `search_rounds` budgets in all;
the searches already answered stay answered (the memo). Jobs the last budget did not reach wait
as before (`WAIT_PRIORITY`, "the cycle's victim searches went to jobs ahead of it"), and the
next cycle, at the next event, searches for them: `carries_budget` tells the simulator not to
cycle again at once. A cycle therefore may place more than a `fairshare-13` cycle and fewer than
`fairshare-13`'s up to 4 cycles at one moment (whose later cycles may see moved ranks), so its
decisions differ: a version of its own.
"""

from __future__ import annotations

from ledger.dispatch.fairshare13 import FairShare13


class FairShare14(FairShare13, frozen=True, kw_only=True):
    """`fairshare-13` with the budget carried as the module docstring says."""

    version: str = "fairshare-14"
    search_rounds: int = 4

    @property
    def carries_budget(self) -> bool:
        """The simulator does not cycle again at once when the searches ran out."""
        return True
