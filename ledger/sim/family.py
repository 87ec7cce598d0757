"""A family of synthetic workloads: one generator, every knob a lab's cluster turns.

Pure: a `Family` value and a seeded `Rng` in, a `Workload` out; no files, no clock.

A workload of the family is a budget tree of `teams` teams (in `programs` programs, shares
drawn 1-4 and 1-5) and `researchers` people per team, and jobs of four kinds:

- *debug*: 1-8 GPUs on one node, 30 s to 15 min, a declared time limit of 5, 10 or 15 min;
  `debug` of all jobs are debug jobs (by count);
- *small*: 1, 2, 4 or 8 GPUs on one node, lognormal work (median 4 h, 15 min to 3 days);
- *medium* gangs: 2, 3, 4 or 8 whole nodes, lognormal work (median 10 h, 1 h to 7 days);
- *large* gangs: at least 1/8 of the cluster: `gpus / 8` and `gpus / 4` (and 256 GPUs where
  that lies between), lognormal work (median 24 h, 2 h to 7 days).

`mix` splits the offered GPU-hours among small, medium and large jobs. Of the non-debug jobs,
`unfunded` of the GPU-hours are unfunded (min runtime 0: the free tier) and `resumable` of the
jobs resumable; funded jobs sign a min runtime of 1-8 h (large ones 4 or 8 h).

**Demand.** `demand` is the GPUs of the jobs alive (pending or running) over the cluster's at
the start: a backlog of `(demand - 1) x gpus` GPUs of jobs is submitted in the first hour (its
kinds drawn job by job with the `mix` weights, so most of its GPUs are large gangs), and
arrivals offer the cluster's capacity (`load`, 1.0) after that *on average over weeks*, so the
backlog stays about constant only over weeks (a policy that wastes capacity lets it grow). Day
by day it moves: day 0 is a Monday, weekdays offer 1.17x the mean of debug, small and medium
work and weekends 0.58x, and teams' seasons and the few large gangs add more (at 4,096 GPUs,
seed 1, days 0-4 offer 1.2-1.6x capacity each and days 5-6 0.55-0.57x; docs/simulation.md,
"Workloads"). Teams' arrivals are Poisson, weighted by budget
fraction x lognormal(0, `skew`) (demand differs from budget) and seasonal (each team's
intensity follows `1 + 0.9 sin(2 pi t / P + phase)`, P 7-21 days: teams go quiet and return);
debug, small and medium jobs come more in working hours. The report measures the demand each policy
saw ("mean demand / supply").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from ledger.core.budget import BudgetAccount, BudgetFile
from ledger.sim.rng import Rng
from ledger.sim.workload import DEBUG_LIMIT_S, SimJob, Workload, team_fractions
from schemas.errors import InvalidCommand

DAY_S = 86_400
HOUR_S = 3_600
KINDS = ("small", "medium", "large")


@dataclass(frozen=True)
class Family:
    """One workload of the family (see the module docstring for each knob)."""

    gpus: int = 1024
    gpus_per_node: int = 8
    demand: float = 2.5
    teams: int = 15
    programs: int = 0
    """0: one program per 5 teams (at least one)."""
    researchers: int = 10
    """People per team (on average; drawn 3 to 3x)."""
    skew: float = 0.8
    mix: tuple[tuple[str, float], ...] = (("small", 0.45), ("medium", 0.35), ("large", 0.2))
    debug: float = 0.15
    unfunded: float = 0.2
    resumable: float = 0.7
    load: float = 1.0
    days: float = 28.0
    seed: int = 1

    def __post_init__(self) -> None:
        problems = []
        if self.gpus < 4 * self.gpus_per_node or self.gpus % self.gpus_per_node:
            problems.append("gpus: a multiple of the node size, at least 4 nodes")
        if not 1.0 <= self.demand <= 20.0:
            problems.append("demand: 1 to 20 (alive GPUs / the cluster's)")
        if not 1 <= self.teams <= 500 or self.researchers < 1:
            problems.append("teams: 1 to 500, researchers at least 1")
        if not 0.0 <= self.skew <= 5.0:
            problems.append("skew: 0 to 5")
        kinds = [k for k, _ in self.mix]
        if set(kinds) - set(KINDS) or sum(w for _, w in self.mix) <= 0:
            problems.append("mix: small, medium, large with weights summing above 0")
        if any(w < 0 for _, w in self.mix):
            problems.append("mix: weights at least 0")
        for name in ("debug", "unfunded", "resumable"):
            if not 0.0 <= getattr(self, name) <= 1.0 or (name == "debug" and self.debug >= 1):
                problems.append(f"{name}: a share, 0 to 1")
        if not 0.0 < self.load <= 5.0 or not 0.0 < self.days <= 366:
            problems.append("load: above 0 and at most 5; days: above 0 and at most 366")
        if problems:
            raise InvalidCommand(f"bad workload family setting: {'; '.join(problems)}")

    @property
    def name(self) -> str:
        mix = "/".join(f"{w:g}" for _, w in self.mix)
        return (
            f"family gpus={self.gpus} demand={self.demand:g} teams={self.teams} "
            f"skew={self.skew:g} mix={mix} debug={self.debug:g} unfunded={self.unfunded:g} "
            f"resumable={self.resumable:g} seed={self.seed}"
        )


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """Pure: 'small:0.5,medium:0.3,large:0.2' -> the mix."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, sep, weight = part.partition(":")
        try:
            w = float(weight)
        except ValueError:
            w = math.nan
        if not sep or kind not in KINDS or not w >= 0:
            raise InvalidCommand(
                f"invalid mix entry {part!r}", hint="write small:W,medium:W,large:W"
            )
        out.append((kind, w))
    return tuple(out)


def _sizes(f: Family) -> dict[str, tuple[tuple[int, float], ...]]:
    n = f.gpus_per_node
    large = {f.gpus // 8, f.gpus // 4}
    if f.gpus // 8 < 256 < f.gpus // 4:
        large.add(256)
    return {
        "debug": ((1, 0.5), (2, 0.2), (4, 0.15), (8, 0.15)),
        "small": ((1, 0.15), (2, 0.15), (4, 0.3), (n, 0.4)),
        "medium": tuple((k * n, w) for k, w in ((2, 0.45), (3, 0.15), (4, 0.3), (8, 0.1))
                        if k * n <= f.gpus // 4) or ((n, 1.0),),
        "large": tuple((g - g % n or n, 1.0) for g in sorted(large)),
    }  # fmt: skip


# (median work, sigma, shortest, longest)
_WORK = {
    "small": (4 * HOUR_S, 1.0, 900, 3 * DAY_S),
    "medium": (10 * HOUR_S, 0.8, HOUR_S, 7 * DAY_S),
    "large": (24 * HOUR_S, 0.7, 2 * HOUR_S, 7 * DAY_S),
}


def _mean_gpu_h(f: Family, kind: str) -> float:
    sizes = _sizes(f)[kind]
    gpus = sum(g * w for g, w in sizes) / sum(w for _, w in sizes)
    return gpus * _clipped_mean(*_WORK[kind]) / HOUR_S


def _clipped_mean(median: float, sigma: float, lo: float, hi: float) -> float:
    """Pure: the mean of min(hi, max(lo, X)) for X lognormal(ln median, sigma)."""
    mu = math.log(median)

    def cdf(x: float) -> float:  # P(ln X <= x)
        return 0.5 * (1.0 + math.erf((x - mu) / (sigma * math.sqrt(2.0))))

    def partial(x: float) -> float:  # E[X; ln X <= x]
        return math.exp(mu + sigma**2 / 2) * cdf(x - sigma**2)

    a, b = math.log(lo), math.log(hi)
    return lo * cdf(a) + (partial(b) - partial(a)) + hi * (1.0 - cdf(b))


def family_tree(f: Family, rng: Rng) -> BudgetFile:
    """Pure: the budget tree: programs with 1-4 shares, teams with 1-5 shares and 3 to
    3 x `researchers` people (lognormal sizes)."""
    programs = f.programs or max(1, f.teams // 5)
    accounts: dict[str, BudgetAccount] = {}
    names = [f"prog{p + 1}" for p in range(programs)]
    for p in names:
        accounts[p] = BudgetAccount(kind="program", shares=rng.randint(1, 4))
    person = 0
    for t in range(f.teams):
        size = max(3, min(3 * f.researchers, round(f.researchers * rng.lognormal(0.0, 0.5))))
        people = [f"r{person + k + 1:04d}" for k in range(size)]
        person += size
        accounts[f"{names[t % programs]}/team{t + 1:02d}"] = BudgetAccount(
            kind="project", shares=rng.randint(1, 5), members=people
        )
    return BudgetFile(accounts=accounts)


def family(f: Family, budget: BudgetFile | None = None) -> Workload:
    """Pure: the seeded workload of `f` (see the module docstring). `budget` replaces the
    generated tree (its projects with members are the teams)."""
    rng = Rng(f.seed)
    tree = budget if budget is not None else family_tree(f, rng.fork("tree"))
    fractions = team_fractions(tree)
    teams = sorted(fractions)
    if not teams:
        raise InvalidCommand("the budget tree has no project with members")
    horizon = f.days * DAY_S
    skew = rng.fork("skew")
    weights = [fractions[t] * skew.lognormal(0.0, f.skew) for t in teams]
    total_w = sum(weights)
    mix = {k: w for k, w in f.mix}
    mix_total = sum(mix.values())
    sizes = _sizes(f)
    season = rng.fork("season")
    jobs: list[SimJob] = []
    for ti, team in enumerate(teams):
        share = weights[ti] / total_w
        period = season.uniform(7.0, 21.0) * DAY_S
        phase = season.uniform(0.0, 2 * math.pi)
        roster = tree.accounts[team].members or [f"{team.rsplit('/', 1)[-1]}-u1"]
        zipf = [1.0 / (k + 1) for k in range(len(roster))]
        r = rng.fork(f"team:{team}")

        def seasonal(t: float, period: float = period, phase: float = phase) -> float:
            return max(0.05, 1.0 + 0.9 * math.sin(2 * math.pi * t / period + phase))

        made: dict[str, int] = {}
        for kind in KINDS:
            part = mix.get(kind, 0.0) / mix_total
            if part <= 0:
                continue
            cr = r.fork(kind)
            gpu_h = _mean_gpu_h(f, kind)
            rate = f.load * f.gpus * part * share / gpu_h / HOUR_S
            arrivals = _arrivals(cr, rate, horizon, kind != "large", seasonal)
            made[kind] = len(arrivals)
            for t in arrivals:
                user = cr.choice(roster, zipf)
                jobs.append(_job(cr, kind, f, team, user, int(t), _pick(cr, sizes[kind])))
        # debug jobs: a share of all jobs, at the team's working hours
        others = sum(made.values())
        if f.debug > 0 and others:
            dr = r.fork("debug")
            rate = others * f.debug / (1.0 - f.debug) / horizon
            for t in _arrivals(dr, rate, horizon, True, seasonal):
                user = dr.choice(roster, zipf)
                jobs.append(_job(dr, "debug", f, team, user, int(t), _pick(dr, sizes["debug"])))
    jobs += _backlog(rng.fork("backlog"), f, tree, teams, weights, sizes)
    jobs.sort(key=lambda j: (j.submit_s, j.account, j.user, j.duration_s, j.gpus))
    keyed = tuple(msgspec.structs.replace(j, key=f"f{n + 1:07d}") for n, j in enumerate(jobs))
    notes = (
        f"workload family (ledger/sim/family.py): {f.gpus} GPUs, demand {f.demand:g}x supply "
        f"(backlog of {f.demand - 1:g}x the cluster at the start, arrivals at load {f.load:g}), "
        f"{len(teams)} teams, skew {f.skew:g}, GPU-hours mix "
        + ", ".join(f"{k} {w / mix_total:.0%}" for k, w in f.mix)
        + f"; {f.debug:.0%} of jobs debug, {f.unfunded:.0%} of GPU-hours unfunded, "
        f"{f.resumable:.0%} of jobs resumable; seed {f.seed}",
    )
    return Workload(name=f.name, jobs=keyed, budget=tree, notes=notes)


def _pick(r: Rng, sizes: Sequence[tuple[int, float]]) -> int:
    return r.choice([g for g, _ in sizes], [w for _, w in sizes])


def _backlog(
    r: Rng,
    f: Family,
    tree: BudgetFile,
    teams: Sequence[str],
    weights: Sequence[float],
    sizes: dict[str, tuple[tuple[int, float], ...]],
) -> list[SimJob]:
    """The jobs submitted in the first hour: about `(demand - 1) x gpus` GPUs of them, each
    of a team drawn by demand weight and a kind drawn by the GPU-hours mix."""
    want = (f.demand - 1.0) * f.gpus
    kinds = [k for k, w in f.mix if w > 0]
    kind_w = [w for _, w in f.mix if w > 0]
    out: list[SimJob] = []
    total = 0
    while total < want:
        team = r.choice(teams, weights)
        kind = r.choice(kinds, kind_w)
        gpus = _pick(r, sizes[kind])
        if total + gpus - want > want - total:
            break
        roster = tree.accounts[team].members or [f"{team.rsplit('/', 1)[-1]}-u1"]
        user = r.choice(roster, [1.0 / (k + 1) for k in range(len(roster))])
        out.append(_job(r, kind, f, team, user, r.randint(0, HOUR_S - 1), gpus))
        total += gpus
    return out


_WORKING_MEAN = (9 * 1.6 + 15 * 0.7) / 24 * (5 + 2 * 0.5) / 7
"""The mean of the working-hours factor over a week: arrivals are scaled by it, so that the
offered load is `load` whatever the hours."""


def _arrivals(
    rng: Rng, rate: float, horizon: float, working_hours: bool, seasonal: Callable[[float], float]
) -> list[float]:
    """Poisson arrivals by thinning (from the end of the first hour): intensity = rate x
    seasonal team demand x (for `working_hours`) busier 9-18 h and half on weekends (scaled to
    a mean of 1)."""
    if rate <= 0:
        return []
    peak = rate * 1.9 * 1.6 / _WORKING_MEAN
    out: list[float] = []
    t = float(HOUR_S)
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return out
        lam = rate * seasonal(t)
        if working_hours:
            hour = (t % DAY_S) / HOUR_S
            weekday = int(t // DAY_S) % 7 < 5
            lam *= (1.6 if 9 <= hour < 18 else 0.7) * (1.0 if weekday else 0.5) / _WORKING_MEAN
        if rng.random() * peak < lam:
            out.append(t)


def _job(r: Rng, kind: str, f: Family, team: str, user: str, at: int, gpus: int) -> SimJob:
    if kind == "debug":
        limit = r.choice([300, 600, DEBUG_LIMIT_S])
        return SimJob(
            key="", account=team, user=user, submit_s=at, duration_s=int(r.uniform(30, limit)),
            gpus=gpus, min_runtime_s=limit, resumable=False, time_limit_s=limit,
        )  # fmt: skip
    median, sigma, lo, hi = _WORK[kind]
    work = int(min(hi, max(lo, r.lognormal(math.log(median), sigma))))
    funded = not r.bernoulli(f.unfunded)
    if kind == "large":
        min_rt = r.choice([4 * HOUR_S, 8 * HOUR_S])
    else:
        min_rt = r.choice([HOUR_S, 2 * HOUR_S, 4 * HOUR_S, 8 * HOUR_S], [0.2, 0.3, 0.3, 0.2])
    return SimJob(
        key="", account=team, user=user, submit_s=at, duration_s=work, gpus=gpus,
        min_runtime_s=min_rt if funded else 0, resumable=r.bernoulli(f.resumable),
        priority=r.choice([0, 1, -1], [0.8, 0.1, 0.1]),
    )  # fmt: skip


_SPEC_KEYS = (
    "demand", "teams", "programs", "researchers", "skew", "mix", "debug", "unfunded",
    "resumable", "load",
)  # fmt: skip
"""The settings a family spec may name (size, days and seed come from the run's options)."""


def parse_spec(text: str) -> dict[str, object]:
    """Pure: 'demand=3 teams=20 mix=small:0.5,large:0.5' -> the settings it names (values
    converted, not yet checked together). Unknown keys and bad values raise InvalidCommand."""
    out: dict[str, object] = {}
    for part in text.split():
        key, sep, value = part.partition("=")
        if not sep or key not in _SPEC_KEYS:
            raise InvalidCommand(
                f"invalid family setting {part!r}",
                hint=f"write KEY=VALUE with KEY one of {', '.join(_SPEC_KEYS)}",
            )
        if key == "mix":
            out[key] = parse_mix(value)
            continue
        try:
            out[key] = int(value) if key in ("teams", "programs", "researchers") else float(value)
        except ValueError:
            raise InvalidCommand(f"invalid family setting {part!r}: not a number") from None
    return out


def from_spec(
    text: str, *, gpus: int, gpus_per_node: int, days: float, seed: int, **more: object
) -> Family:
    """Pure: the family member a spec (see `parse_spec`) names on a cluster of `gpus` GPUs
    over `days` days with `seed`; `more` settings override the spec's (a sweep's grid)."""
    settings = {**parse_spec(text), **more}
    return Family(gpus=gpus, gpus_per_node=gpus_per_node, days=days, seed=seed, **settings)  # type: ignore[arg-type]
