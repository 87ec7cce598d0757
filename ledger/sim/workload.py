"""Workloads for the simulator: job traces, what traces lack, and a synthetic Ai2-shaped generator.

Pure: functions of bytes, configs and a seeded `Rng`; no files, no clock. The CLI
(`ledger/cli/sim.py`) reads and writes the files.

The trace format is the normalised CSV of the shared traces (`job_id,user,group,submit_time_s,
duration_s,gpus,status`), optionally gzip'd, with the optional columns `min_runtime_s`,
`resumable`, `priority` and (this project's addition) `time_limit_s`. When a column is present its
values are used as given; what a trace lacks is filled in by `resolve`, seeded and stated in
`Workload.notes`:

- budget tree: when jobs have no `group`, a generated tree (`programs` programs, `teams` projects
  with equal shares, `users` researchers) or the projects of a budgets TOML; each job goes to a
  team drawn with weights (budget fraction x lognormal skew, so demand differs from budget), and
  to a user of that team drawn with Zipf weights. A trace user keeps one team for all its jobs.
  A `group` written as a path (`prog/proj`) is that budget-tree node; a plain group `vc1` becomes
  the project `trace/vc1`.
- time limit: when absent, a job that ran <= 15 min declares `time_limit_s = 900` (its user knows
  it is a debug job) and others declare none.
- min runtime: when absent, debug jobs sign their time limit; others draw from the stated
  distribution (`DEFAULT_MIN_RUNTIME`: 18% unfunded as at Ai2, the rest 1-8 h).
- resumable: when absent, true with probability `resumable_p`; priority: a number or HIGH,
  NORMAL, LOW (1, 0, -1), when absent 0.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from ledger.core.budget import BudgetAccount, BudgetFile
from ledger.sim.rng import Rng
from schemas.bounds import TEN_YEARS_S
from schemas.errors import InvalidCommand
from schemas.units import parse_duration

REQUIRED = ("job_id", "user", "group", "submit_time_s", "duration_s", "gpus", "status")
OPTIONAL = ("min_runtime_s", "resumable", "priority", "time_limit_s")
DEBUG_LIMIT_S = 900
"""A job declaring a time limit <= 15 min (and fitting on one node) is the debug class."""
DEFAULT_MIN_RUNTIME = "0:0.18,1h:0.22,4h:0.30,8h:0.30"
"""Declared min runtime of non-debug jobs when a trace has none: value:weight pairs."""
DAY_S = 86_400
HOUR_S = 3_600

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a trace file, as written."""

    job_id: str
    user: str
    group: str
    submit_time_s: int
    duration_s: int
    gpus: int
    status: str = "unknown"
    min_runtime_s: int | None = None
    resumable: bool | None = None
    priority: int | None = None
    time_limit_s: int | None = None


class SimJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job of a resolved workload: everything the simulator submits."""

    key: str
    """The trace's job id (the ledger gives its own job ids)."""
    account: str
    """The project (team) path."""
    user: str
    submit_s: int
    """Seconds after the simulation start."""
    duration_s: int
    gpus: int
    min_runtime_s: int
    resumable: bool
    priority: int = 0
    time_limit_s: int | None = None
    status: str = "unknown"

    @property
    def funded(self) -> bool:
        return self.min_runtime_s > 0


@dataclass(frozen=True)
class Workload:
    """Jobs (sorted by submit time, then key), the budget tree they run in, and what was assumed."""

    name: str
    jobs: tuple[SimJob, ...]
    budget: BudgetFile
    notes: tuple[str, ...] = ()

    def span_s(self) -> int:
        return max((j.submit_s for j in self.jobs), default=0)

    def offered_gpu_h(self, horizon_s: float | None = None) -> float:
        """GPU-hours submitted (before `horizon_s` when given)."""
        return sum(
            j.gpus * j.duration_s / HOUR_S
            for j in self.jobs
            if horizon_s is None or j.submit_s < horizon_s
        )


# --- parsing -----------------------------------------------------------------------------------


def parse_distribution(text: str) -> tuple[tuple[int, float], ...]:
    """Pure: 'VALUE:WEIGHT,...' (values are durations) -> ((seconds, weight), ...)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        value, sep, weight = part.partition(":")
        try:
            w = float(weight) if sep else math.nan
        except ValueError:
            w = math.nan
        if not w >= 0:
            raise InvalidCommand(
                f"invalid distribution entry {part!r}", hint="write VALUE:WEIGHT, e.g. 4h:0.3"
            )
        out.append((parse_duration(value), w))
    if not out or sum(w for _, w in out) <= 0:
        raise InvalidCommand(f"empty distribution {text!r}", hint=f"e.g. {DEFAULT_MIN_RUNTIME!r}")
    return tuple(out)


def _bool(text: str, where: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes"):
        return True
    if t in ("false", "0", "no"):
        return False
    raise InvalidCommand(f"{where}: resumable must be true or false, got {text!r}")


PRIORITY_NAMES = {"HIGH": 1, "NORMAL": 0, "LOW": -1}
"""Priority as a word (any case): the levels higher first."""


def _priority(text: str, where: str) -> int:
    """A number, or HIGH / NORMAL / LOW (1 / 0 / -1)."""
    named = PRIORITY_NAMES.get(text.upper())
    if named is not None:
        return named
    try:
        return int(float(text))
    except ValueError as e:
        raise InvalidCommand(
            f"{where}: priority must be a number or HIGH, NORMAL or LOW, got {text!r}"
        ) from e


def _int(text: str, where: str, column: str) -> int:
    try:
        return int(float(text))
    except (ValueError, OverflowError) as e:  # OverflowError: inf, 1e400
        raise InvalidCommand(f"{where}: {column} must be a finite number, got {text!r}") from e


@dataclass(frozen=True)
class Trace:
    """The rows of a trace file and the optional columns it has (an empty value in a column the
    file has is given: no time limit, say; a column it lacks is filled in by `resolve`)."""

    jobs: tuple[TraceJob, ...]
    columns: frozenset[str] = frozenset()


def parse_trace(data: bytes, name: str = "trace") -> Trace:
    """Pure: the rows of a trace CSV (gzip'd or not), optional columns used when present."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise InvalidCommand(f"{name}: corrupt gzip data: {e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidCommand(f"{name}: not UTF-8 text: {e}") from e
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise InvalidCommand(
            f"{name}: missing columns {', '.join(missing)}",
            hint=f"a trace has the header {','.join(REQUIRED)} (see the traces README)",
        )
    jobs = []
    for n, row in enumerate(reader, start=2):
        where = f"{name} line {n}"
        opt = {c: (row.get(c) or "").strip() for c in OPTIONAL}
        job = TraceJob(
            job_id=row["job_id"].strip(),
            user=(row["user"] or "").strip(),
            group=(row["group"] or "").strip(),
            submit_time_s=_int(row["submit_time_s"], where, "submit_time_s"),
            # a job still running when the trace was cut may say it ran for decades: it runs
            # to the end of any simulation at ten years (the longest a job may say it runs)
            duration_s=min(_int(row["duration_s"], where, "duration_s"), TEN_YEARS_S),
            gpus=_int(row["gpus"], where, "gpus"),
            status=(row["status"] or "unknown").strip() or "unknown",
            min_runtime_s=_int(opt["min_runtime_s"], where, "min_runtime_s")
            if opt["min_runtime_s"]
            else None,
            resumable=_bool(opt["resumable"], where) if opt["resumable"] else None,
            priority=_priority(opt["priority"], where) if opt["priority"] else None,
            time_limit_s=_int(opt["time_limit_s"], where, "time_limit_s")
            if opt["time_limit_s"]
            else None,
        )
        if job.gpus < 1 or job.duration_s < 0 or job.submit_time_s < 0:
            raise InvalidCommand(f"{where}: gpus >= 1, duration_s >= 0, submit_time_s >= 0")
        # what a submission would refuse is refused here, before any run (atk53-26 F6: a time
        # limit of 0 stopped a run when its clock reached the row, with no line named)
        if job.time_limit_s is not None and not 1 <= job.time_limit_s <= TEN_YEARS_S:
            raise InvalidCommand(
                f"{where}: time_limit_s must be 1 to {TEN_YEARS_S} seconds (or empty: no "
                f"limit), got {job.time_limit_s}"
            )
        if job.min_runtime_s is not None and job.min_runtime_s < 0:
            raise InvalidCommand(f"{where}: min_runtime_s must be >= 0, got {job.min_runtime_s}")
        jobs.append(job)
    return Trace(jobs=tuple(jobs), columns=frozenset(c for c in OPTIONAL if c in columns))


def dump_trace(jobs: Iterable[SimJob], *, gzipped: bool = False) -> bytes:
    """Pure: a workload as a trace CSV with every optional column (gzip'd without a timestamp,
    so the same workload gives the same bytes)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow((*REQUIRED, *OPTIONAL))
    for j in jobs:
        w.writerow(
            (
                j.key,
                j.user,
                j.account,
                j.submit_s,
                j.duration_s,
                j.gpus,
                j.status,
                j.min_runtime_s,
                "true" if j.resumable else "false",
                j.priority,
                "" if j.time_limit_s is None else j.time_limit_s,
            )
        )
    data = out.getvalue().encode()
    return gzip.compress(data, mtime=0) if gzipped else data


def budget_toml(budget: BudgetFile) -> str:
    """Pure: a budget tree as the TOML `ledger.core.budget.parse` reads (accounts by path)."""
    lines = []
    for path in sorted(budget.accounts, key=lambda p: (p.count("/"), p)):
        a = budget.accounts[path]
        lines.append(f'[accounts."{path}"]')
        lines.append(f'kind = "{a.kind}"')
        lines.append(f"shares = {a.shares}")
        if a.members is not None:
            lines.append("members = [" + ", ".join(f'"{m}"' for m in a.members) + "]")
        lines.append("")
    return "\n".join(lines)


# --- what traces lack --------------------------------------------------------------------------


@dataclass(frozen=True)
class Assumptions:
    """How to fill in what a trace lacks (each seeded, each stated in the workload's notes)."""

    seed: int = 1
    programs: int = 3
    teams: int = 15
    users: int = 150
    team_skew: float = 0.8
    """Sigma of the lognormal factor on each team's demand weight (0: demand follows budget)."""
    min_runtime: tuple[tuple[int, float], ...] = field(
        default_factory=lambda: parse_distribution(DEFAULT_MIN_RUNTIME)
    )
    resumable_p: float = 0.7
    debug_time_limit: bool = True
    """Jobs that ran <= 15 min declare a 15 min time limit (debug class) when the trace says
    nothing; off: no time limits."""


def sanitize(name: str, fallback: str) -> str:
    """Pure: a trace name made valid as a ledger name (letters, digits, _ . -, <= 63 chars)."""
    s = _NAME_BAD.sub("-", name.strip())[:63].lstrip("_.-")
    return s or fallback


def generated_tree(programs: int, teams: int, users: int) -> BudgetFile:
    """Pure: programs `progN` with equal shares, projects `progN/teamMM` (team m in program
    m mod programs) with equal shares, users `uKKK` (user k in team k mod teams)."""
    if not (1 <= programs <= teams <= users):
        raise InvalidCommand("need 1 <= programs <= teams <= users")
    accounts: dict[str, BudgetAccount] = {}
    for p in range(programs):
        accounts[f"prog{p + 1}"] = BudgetAccount(kind="program", shares=1)
    team_paths = [f"prog{t % programs + 1}/team{t + 1:02d}" for t in range(teams)]
    members: dict[str, list[str]] = {t: [] for t in team_paths}
    for u in range(users):
        members[team_paths[u % teams]].append(f"u{u + 1:03d}")
    for t in team_paths:
        accounts[t] = BudgetAccount(kind="project", shares=1, members=members[t])
    return BudgetFile(accounts=accounts)


def team_fractions(budget: BudgetFile) -> dict[str, float]:
    """Pure: each project's fraction of the cluster (product of norm shares down the tree), for
    projects that have members (the teams jobs can run in)."""
    accts = budget.accounts
    sibling: dict[str | None, int] = {}
    for path, a in accts.items():
        parent = path.rsplit("/", 1)[0] if "/" in path else None
        sibling[parent] = sibling.get(parent, 0) + a.shares
    out = {}
    for path, a in sorted(accts.items()):
        if a.kind != "project" or not a.members:
            continue
        parts = path.split("/")
        frac = 1.0
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            parent = "/".join(parts[: i - 1]) if i > 1 else None
            total = sibling.get(parent, 0)
            frac *= accts[p].shares / total if total and p in accts else 0.0
        out[path] = frac
    return out


def _zipf(n: int) -> list[float]:
    return [1.0 / (k + 1) for k in range(n)]


def resolve(
    trace: Trace,
    how: Assumptions,
    budget: BudgetFile | None = None,
    name: str = "trace",
) -> Workload:
    """Pure: the workload of a trace, filling in what it lacks as `how` says (see the module
    docstring). `budget` (a parsed budgets TOML) gives the tree; otherwise one is generated."""
    rng = Rng(how.seed)
    given = trace.columns
    notes: list[str] = []
    accounts = dict(budget.accounts) if budget is not None else {}
    needs_teams = any(not j.group for j in trace.jobs)
    if budget is not None:
        notes.append(f"budget tree from the budgets file ({len(accounts)} accounts)")
    elif needs_teams:
        accounts = dict(generated_tree(how.programs, how.teams, how.users).accounts)
        notes.append(
            f"budget tree generated: {how.programs} programs, {how.teams} teams with equal "
            f"shares, {how.users} users (the trace has no groups)"
        )
    members: dict[str, list[str]] = {
        p: list(a.members or []) for p, a in accounts.items() if a.kind == "project"
    }
    fractions = team_fractions(BudgetFile(accounts=accounts)) if accounts else {}
    teams = sorted(fractions)
    pick = rng.fork("assign")
    skew = rng.fork("skew")
    demand_w = [fractions[t] * skew.lognormal(0.0, how.team_skew) for t in teams]
    if needs_teams:
        if not teams:
            raise InvalidCommand(
                "the budgets file has no project with members to assign jobs to",
                hint="list members in its projects, or drop --budgets to generate a tree",
            )
        notes.append(
            "jobs without a group assigned to teams with weights budget fraction x lognormal(0, "
            f"{how.team_skew:g}), to users of the team with Zipf weights (seed {how.seed})"
        )
    user_team: dict[str, str] = {}
    extra: dict[str, set[str]] = {}
    contract = rng.fork("contract")
    out: list[SimJob] = []
    for j in trace.jobs:
        # 1. team and user
        if j.group:
            account = j.group if "/" in j.group else f"trace/{sanitize(j.group, 'group')}"
            account = "/".join(sanitize(p, "x") for p in account.split("/"))
            user = sanitize(j.user, "anon") if j.user else "anon"
        else:
            if j.user:
                user = sanitize(j.user, "anon")
                team = user_team.get(user)
                if team is None:
                    team = user_team[user] = pick.choice(teams, demand_w)
                account = team
            else:
                account = pick.choice(teams, demand_w)
                roster = members[account] or [f"{account.rsplit('/', 1)[-1]}-u1"]
                user = pick.choice(roster, _zipf(len(roster)))
        if user not in members.get(account, ()):
            extra.setdefault(account, set()).add(user)
        # 2. contract
        limit = j.time_limit_s
        if "time_limit_s" not in given and how.debug_time_limit and j.duration_s <= DEBUG_LIMIT_S:
            limit = DEBUG_LIMIT_S
        if j.min_runtime_s is not None:
            min_rt = j.min_runtime_s
        elif limit is not None and limit <= DEBUG_LIMIT_S:
            min_rt = limit
        else:
            values = [v for v, _ in how.min_runtime]
            min_rt = contract.choice(values, [w for _, w in how.min_runtime])
        resumable = j.resumable if j.resumable is not None else contract.bernoulli(how.resumable_p)
        out.append(
            SimJob(
                key=j.job_id,
                account=account,
                user=user,
                submit_s=j.submit_time_s,
                duration_s=j.duration_s,
                gpus=j.gpus,
                min_runtime_s=min_rt,
                resumable=resumable,
                priority=j.priority or 0,
                time_limit_s=limit,
                status=j.status,
            )
        )
    # 3. accounts for groups and users the tree does not have
    for account in sorted({j.account for j in out}):
        parts = account.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in accounts:
                accounts[p] = BudgetAccount(kind="program" if i == 1 else "project", shares=1)
                if i > 1:
                    notes.append(f"account {p} opened with 1 share (not in the budget tree)")
    for account, users in sorted(extra.items()):
        a = accounts[account]
        accounts[account] = msgspec.structs.replace(a, members=sorted(set(a.members or []) | users))
    lacks = {c: c not in given for c in OPTIONAL}
    if lacks["time_limit_s"]:
        notes.append(
            "time limit (trace has none): jobs that ran <= 15 min declare 900 s (debug class)"
            if how.debug_time_limit
            else "time limit (trace has none): none declared"
        )
    if lacks["min_runtime_s"]:
        dist = ", ".join(f"{v}s:{w:g}" for v, w in how.min_runtime)
        notes.append(
            f"min runtime (trace has none): debug jobs sign their time limit; others {dist}"
        )
    if lacks["resumable"]:
        notes.append(f"resumable (trace has none): true with probability {how.resumable_p:g}")
    if lacks["priority"]:
        notes.append("priority (trace has none): 0")
    out.sort(key=lambda s: (s.submit_s, _key_order(s.key)))
    return Workload(
        name=name, jobs=tuple(out), budget=BudgetFile(accounts=accounts), notes=tuple(notes)
    )


def _key_order(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)


# --- the synthetic Ai2-shaped workload ---------------------------------------------------------


@dataclass(frozen=True)
class Synthetic:
    """An Ai2-shaped workload: teams in a program -> project -> person tree, a mix of debug,
    mid-size and multi-node jobs, seasonal team demand, and an unfunded pool."""

    seed: int = 1
    programs: int = 3
    teams: int = 15
    users: int = 150
    days: float = 28.0
    capacity_gpus: int = 256
    gpus_per_node: int = 8
    load: float = 1.0
    """Offered funded + unfunded GPU-hours of mid and multi-node jobs / capacity GPU-hours. Open
    arrivals above 1.0 build a queue: the alive demand (pending + running GPUs) that owed is
    capped at then runs at 2-3x the supply (the report measures it)."""
    unfunded_p: float = 0.3
    """Probability that a mid-size job runs unfunded (min runtime 0): the unfunded pool."""
    debug_per_user_day: float = 0.5
    """Debug jobs per researcher per weekday (half on weekends)."""
    multi_share: float = 0.5
    """Share of the offered GPU-hours in multi-node jobs (the rest: mid-size jobs)."""


_DEBUG_GPUS = ((1, 0.5), (2, 0.2), (4, 0.15), (8, 0.15))
_MID_GPUS = ((1, 0.15), (2, 0.15), (4, 0.3), (8, 0.4))
_MID_RUNTIME = ((HOUR_S, 0.2), (2 * HOUR_S, 0.3), (4 * HOUR_S, 0.3), (8 * HOUR_S, 0.2))
_MID_MEDIAN_S = 4 * HOUR_S
_MID_SIGMA = 1.0
_MULTI_MEDIAN_S = 10 * HOUR_S
_MULTI_SIGMA = 0.8


def _multi_gpus(g: Synthetic) -> tuple[tuple[int, float], ...]:
    n = g.gpus_per_node
    sizes = ((2 * n, 0.45), (3 * n, 0.15), (4 * n, 0.3), (8 * n, 0.1))
    return tuple((s, w) for s, w in sizes if s <= g.capacity_gpus // 4) or ((n, 1.0),)


def _mean(dist: Sequence[tuple[int, float]]) -> float:
    return sum(v * w for v, w in dist) / sum(w for _, w in dist)


def synthetic_tree(g: Synthetic, rng: Rng) -> BudgetFile:
    """Pure: programs with 1-4 shares, teams with 1-5 shares and 3+ researchers each (sizes
    lognormal, summing to `users`)."""
    accounts: dict[str, BudgetAccount] = {}
    programs = [f"prog{p + 1}" for p in range(g.programs)]
    for p in programs:
        accounts[p] = BudgetAccount(kind="program", shares=rng.randint(1, 4))
    sizes = [rng.lognormal(0.0, 0.5) for _ in range(g.teams)]
    spare = g.users - 3 * g.teams
    if spare < 0:
        raise InvalidCommand("need at least 3 users per team")
    counts = [3 + int(spare * s / sum(sizes)) for s in sizes]
    for i in range(g.users - sum(counts)):
        counts[i % g.teams] += 1
    user = 0
    for t in range(g.teams):
        names = [f"r{user + k + 1:03d}" for k in range(counts[t])]
        user += counts[t]
        accounts[f"{programs[t % g.programs]}/team{t + 1:02d}"] = BudgetAccount(
            kind="project", shares=rng.randint(1, 5), members=names
        )
    return BudgetFile(accounts=accounts)


def synthetic(g: Synthetic, budget: BudgetFile | None = None) -> Workload:
    """Pure: the seeded synthetic workload (see `Synthetic`). `budget` replaces the generated
    tree (its projects with members are the teams)."""
    rng = Rng(g.seed)
    tree = budget if budget is not None else synthetic_tree(g, rng.fork("tree"))
    fractions = team_fractions(tree)
    teams = sorted(fractions)
    if not teams:
        raise InvalidCommand("the budget tree has no project with members")
    horizon = g.days * DAY_S
    target_gpu_h = g.load * g.capacity_gpus * horizon / HOUR_S
    multi = _multi_gpus(g)
    mid_gpu_h = _mean(_MID_GPUS) * _MID_MEDIAN_S * math.exp(_MID_SIGMA**2 / 2) / HOUR_S
    multi_gpu_h = _mean(multi) * _MULTI_MEDIAN_S * math.exp(_MULTI_SIGMA**2 / 2) / HOUR_S
    season = rng.fork("season")
    skew = rng.fork("skew")
    weights = [fractions[t] * skew.lognormal(0.0, 0.4) for t in teams]
    total_w = sum(weights)
    jobs: list[SimJob] = []
    for ti, team in enumerate(teams):
        period = season.uniform(7.0, 21.0) * DAY_S
        phase = season.uniform(0.0, 2 * math.pi)
        share = weights[ti] / total_w
        roster = tree.accounts[team].members or [f"{team.rsplit('/', 1)[-1]}-u1"]
        zipf = _zipf(len(roster))
        r = rng.fork(f"team:{team}")

        def seasonal(t: float, period: float = period, phase: float = phase) -> float:
            return max(0.05, 1.0 + 0.9 * math.sin(2 * math.pi * t / period + phase))

        rates = {
            "multi": target_gpu_h * g.multi_share * share / multi_gpu_h / horizon,
            "mid": target_gpu_h * (1 - g.multi_share) * share / mid_gpu_h / horizon,
            "debug": g.debug_per_user_day * len(roster) / DAY_S,
        }
        for klass, rate in rates.items():
            cr = r.fork(klass)
            for t in _arrivals(cr, rate, horizon, klass, seasonal):
                user = cr.choice(roster, zipf)
                jobs.append(_job(cr, klass, g, team, user, int(t), multi))
    jobs.sort(key=lambda j: (j.submit_s, j.account, j.user, j.duration_s, j.gpus))
    keyed = tuple(msgspec.structs.replace(j, key=f"s{n + 1:06d}") for n, j in enumerate(jobs))
    notes = (
        f"synthetic Ai2-shaped workload: seed {g.seed}, {len(teams)} teams, "
        f"{sum(len(tree.accounts[t].members or []) for t in teams)} researchers, "
        f"{g.days:g} days, offered load {g.load:g} x {g.capacity_gpus} GPUs in mid-size and "
        f"multi-node jobs, {g.debug_per_user_day:g} debug jobs per researcher per weekday, "
        f"{g.unfunded_p:.0%} of mid-size jobs unfunded",
    )
    return Workload(name="synthetic", jobs=keyed, budget=tree, notes=notes)


def _arrivals(
    rng: Rng, rate: float, horizon: float, klass: str, seasonal: Callable[[float], float]
) -> list[float]:
    """Poisson arrivals by thinning: intensity = rate x seasonal team demand x (for debug and
    mid-size jobs) the working day (busier 9-18 h, half on weekends)."""
    peak = rate * 1.9 * 1.6
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return out
        lam = rate * seasonal(t)
        if klass != "multi":
            hour = (t % DAY_S) / HOUR_S
            weekday = int(t // DAY_S) % 7 < 5
            lam *= (1.6 if 9 <= hour < 18 else 0.7) * (1.0 if weekday else 0.5)
        if rng.random() * peak < lam:
            out.append(t)


def _job(
    r: Rng,
    klass: str,
    g: Synthetic,
    team: str,
    user: str,
    at: int,
    multi: Sequence[tuple[int, float]],
) -> SimJob:
    if klass == "debug":
        gpus = r.choice([v for v, _ in _DEBUG_GPUS], [w for _, w in _DEBUG_GPUS])
        limit = r.choice([300, 600, 900])
        duration = int(r.uniform(30, limit))
        return SimJob(
            key="", account=team, user=user, submit_s=at, duration_s=duration, gpus=gpus,
            min_runtime_s=limit, resumable=False, time_limit_s=limit,
        )  # fmt: skip
    if klass == "mid":
        gpus = r.choice([v for v, _ in _MID_GPUS], [w for _, w in _MID_GPUS])
        duration = int(min(72 * HOUR_S, max(900, r.lognormal(math.log(_MID_MEDIAN_S), _MID_SIGMA))))
        funded = not r.bernoulli(g.unfunded_p)
        min_rt = r.choice([v for v, _ in _MID_RUNTIME], [w for _, w in _MID_RUNTIME])
        resumable = r.bernoulli(0.7)
        priority = r.choice([0, 1, -1], [0.8, 0.1, 0.1])
        return SimJob(
            key="", account=team, user=user, submit_s=at, duration_s=duration, gpus=gpus,
            min_runtime_s=min_rt if funded else 0, resumable=resumable, priority=priority,
        )  # fmt: skip
    gpus = r.choice([v for v, _ in multi], [w for _, w in multi])
    duration = int(
        min(7 * DAY_S, max(HOUR_S, r.lognormal(math.log(_MULTI_MEDIAN_S), _MULTI_SIGMA)))
    )
    funded = not r.bernoulli(0.1)
    return SimJob(
        key="", account=team, user=user, submit_s=at, duration_s=duration, gpus=gpus,
        min_runtime_s=r.choice([4 * HOUR_S, 8 * HOUR_S]) if funded else 0,
        resumable=r.bernoulli(0.85), priority=r.choice([0, 1], [0.9, 0.1]),
    )  # fmt: skip
