"""The names and meanings of a sort key's parts, per policy version (the queue's and
`priority`'s columns, like `sprio`'s): a layout this version does not know reads `part_N`.
Moved from `ledger.reads.preview` (which re-exports `key_parts`) to keep that module small."""

from __future__ import annotations

from collections.abc import Sequence

from schemas import views as v

_DEBUG_LANE = ("debug_lane", "0: a funded debug-class job in the debug lane, 1: any other")
_FUNDED_FIRST = ("funded_class", "0 funded, 1 unfunded (funded work goes first)")
_BY_SUBMIT = (("submitted_at", "submit time, earlier first"), ("job_id", "the tie-break"))
_INSIDE_TEAM = (
    ("priority_neg", "declared priority, negated: orders jobs inside one team"),
    ("user_rank", "the user leaf's fair-share rank inside the team"),
    *_BY_SUBMIT,
)
_TEAM_RANK = ("team_rank", "the team's fair-share rank, 0 the best")
_KEY_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "fairshare-3": (
        _DEBUG_LANE,
        _FUNDED_FIRST,
        ("team_place", "the team's place by its share of the whole tree, 0 the best"),
        *_INSIDE_TEAM,
    ),
    "fairshare-2": (_DEBUG_LANE, _FUNDED_FIRST, _TEAM_RANK, *_INSIDE_TEAM),
    "fairshare": (_FUNDED_FIRST, _TEAM_RANK, *_INSIDE_TEAM),
    "fifo": _BY_SUBMIT,
    "slurm": (
        ("funded_class", "0 funded, 1 unfunded"),
        ("multifactor_neg", "Slurm's multifactor priority, negated"),
        ("priority_neg", "declared priority, negated"),
        *_BY_SUBMIT,
    ),
    "legacy": (
        ("funded_class", "0 funded, 1 unfunded"),
        ("priority_neg", "declared priority, negated"),
        *_BY_SUBMIT,
    ),
}
_KEY_PARTS["fairshare-4"] = _KEY_PARTS["fairshare-3"]  # the same order, another gain
_KEY_PARTS["fairshare-5"] = (
    *_KEY_PARTS["fairshare-3"][:2],
    ("unfunded_ran", "1: an unfunded job that ran and was preempted (jobs that never ran first)"),
    *_KEY_PARTS["fairshare-3"][2:],
)
_KEY_PARTS["fairshare-6"] = _KEY_PARTS["fairshare-5"]  # the same order, a larger debug reserve
_KEY_PARTS["fairshare-7"] = _KEY_PARTS["fairshare-5"]  # the same order (requeued_last on)
_KEY_PARTS["fairshare-8"] = (
    *_KEY_PARTS["fairshare-5"][:3],
    ("reservation", "0: the job the cycle reserves for (the oldest large funded job)"),
    *_KEY_PARTS["fairshare-5"][3:],
)
_KEY_PARTS["fairshare-9"] = _KEY_PARTS["fairshare-5"]  # the same order (fairshare-7's)
_KEY_PARTS["fairshare-10"] = (
    *_KEY_PARTS["fairshare-5"][:3],
    ("turn", "the job's turn in the cycle's order: teams re-ranked as the cycle placed jobs"),
    *_KEY_PARTS["fairshare-5"][4:],
)
_KEY_PARTS["fairshare-11"] = _KEY_PARTS["fairshare-5"]  # fairshare-7's order (no lift)
_KEY_PARTS["fairshare-12"] = _KEY_PARTS["fairshare-5"]  # fairshare-7's order (no lift)
_KEY_PARTS["fairshare-13"] = _KEY_PARTS["fairshare-5"]  # fairshare-7's order (no lift)
_KEY_PARTS["fairshare-14"] = _KEY_PARTS["fairshare-5"]  # fairshare-7's order (no lift)
_KEY_PARTS["fairshare-16"] = (
    *_KEY_PARTS["fairshare-3"][:2],
    (
        "unfunded_step",
        "1: an unfunded job that ran and was preempted (with requeued_first: one that never ran)",
    ),
    *_KEY_PARTS["fairshare-3"][2:],
)
_KEY_PARTS["fairshare-17"] = (  # funded jobs' keys, and unfunded ones' with free_order "team"
    *_KEY_PARTS["fairshare-3"][:2],
    (
        "unfunded_step",
        '0 for a funded job; with free_order "team": 1 for an unfunded job that ran and was '
        "preempted",
    ),
    *_KEY_PARTS["fairshare-3"][2:],
)
_FREE_TIER = (
    ("debug_lane", "1: not in the debug lane (an unfunded job)"),
    ("funded_class", "1 unfunded: the free tier, after every funded job"),
)
_MORE_LAYOUTS: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "fairshare-17": (  # the free tier's keys, told apart by their length
        (
            *_FREE_TIER,
            ("submitted_at", 'submit time, earlier first (free_order "oldest")'),
            ("job_id", "the tie-break"),
        ),
        (*_FREE_TIER, ("gpus", 'GPUs asked, fewest first (free_order "smallest")'), *_BY_SUBMIT),
    ),
}
"""Other layouts of one version's keys, picked by the key's length when its main layout's
differs (`fairshare-17`'s free tier goes by submit time alone: a shorter key)."""
_KEY_PARTS["slurm-lab-1"] = (
    ("qos", "0 debug, 1 normal (funded), 2 scavenger (unfunded)"),
    *_KEY_PARTS["slurm"][1:],
)


def key_parts(policy_version: str, key: Sequence[float | int | str]) -> list[v.KeyPart]:
    """Pure: the parts of a sort key with their names (unknown layouts get `part_N`)."""
    names = _KEY_PARTS.get(policy_version) or _KEY_PARTS.get(policy_version.split("-", 1)[0], ())
    if len(names) != len(key):
        more = (x for x in _MORE_LAYOUTS.get(policy_version, ()) if len(x) == len(key))
        names = next(more, tuple((f"part_{i + 1}", "") for i in range(len(key))))
    return [v.KeyPart(name=n, value=x, meaning=m) for (n, m), x in zip(names, key, strict=True)]
