"""The read models and fair-share numbers folded in plain Python: the oracle for the SQL.

Pure: `fold` takes decoded events with their log positions, one at a time, and builds the same
rows the projector writes into DuckDB (jobs, job intervals, account and node history, preemptions,
decisions); the methods of `RefState` answer the same questions as `queries.py`, with the math of
`fairshare.py`. It favours obviousness over speed: use it on test-sized logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from projections import fairshare as fs
from schemas import events as e
from schemas.events import tag_of

Row = dict[str, Any]

_STATE_OF_NODE_EVENT: dict[type, str] = {
    e.NodeRegistered: "active",
    e.NodeDrainRequested: "draining",
    e.NodeDrained: "drained",
    e.NodeReturned: "active",
    e.NodeRemoved: "removed",
    e.NodeLost: "lost",
}
_DELIVERING = ("active", "draining")
"""Node states in which a node's GPUs count as capacity."""


@dataclass
class RefState:
    """Everything the projection holds, as Python rows."""

    position: int = 0
    account_history: list[Row] = field(default_factory=list)
    node_history: list[Row] = field(default_factory=list)
    jobs: dict[int, Row] = field(default_factory=dict)
    intervals: list[Row] = field(default_factory=list)
    preemptions: list[Row] = field(default_factory=list)
    decisions: list[Row] = field(default_factory=list)
    _open: dict[int, Row] = field(default_factory=dict)
    _node_type: dict[str, str] = field(default_factory=dict)

    # --- questions ----------------------------------------------------------------------------

    def accounts_at(self, at: float) -> dict[str, Row]:
        """Every account that existed at `at`: path, parent, kind, shares, open."""
        out: dict[str, Row] = {}
        for h in self.account_history:
            if h["changed_at"] > at:
                continue
            a = out.setdefault(h["account"], {"path": h["account"], "shares": 0})
            if h["kind"] is not None:
                a["parent"], a["kind"] = h["parent"], h["kind"]
            if h["shares"] is not None:
                a["shares"] = h["shares"]
            if h["open"] is not None:
                a["open"] = h["open"]
        return out

    def usage_intervals(self) -> list[fs.Interval]:
        return [
            fs.Interval(
                leaf=i["leaf"],
                user=i["user_name"],
                gpus=i["gpus"],
                funded=i["funded"],
                start_at=i["start_at"],
                end_at=i["end_at"],
                gpu_type=i["gpu_type"],
                run_start_at=i["run_start_at"],
                run_end_at=i["run_end_at"],
            )
            for i in self.intervals
        ]

    def account_usage(self, at: float, policy: fs.UsagePolicy) -> dict[str, float]:
        return fs.rollup(fs.leaf_usage(self.usage_intervals(), at, policy))

    def user_usage(self, at: float, policy: fs.UsagePolicy) -> dict[str, float]:
        return fs.user_usage(self.usage_intervals(), at, policy)

    def fair_tree(self, at: float, policy: fs.UsagePolicy) -> fs.FairTree:
        usage = self.account_usage(at, policy)
        return fs.fair_tree(
            fs.AccountUsage(
                path=a["path"],
                parent=a["parent"],
                kind=a["kind"],
                shares=a["shares"],
                usage=usage.get(a["path"], 0.0),
            )
            for a in self.accounts_at(at).values()
            if a.get("open")
        )

    def team_hours(self, start: float, end: float, team_depth: int = 2) -> list[fs.TeamHour]:
        teams = [
            h["account"]
            for h in self.account_history
            if h["changed_at"] < end and len(h["account"].split("/")) == team_depth
        ]
        allocation = {}
        for h in fs.hours(start, end):
            open_accts = [
                fs.AccountShare(path=a["path"], parent=a["parent"], shares=a["shares"])
                for a in self.accounts_at(h).values()
                if a.get("open")
            ]
            allocation[h] = fs.allocations(open_accts, team_depth)
        delivered = [
            fs.Span(i["leaf"], i["gpus"], i["start_at"], i["end_at"])
            for i in self.intervals
            if i["funded"]
        ]
        demand = [
            fs.Span(j["leaf"], j["gpus"], j["submitted_at"], j["finished_at"])
            for j in self.jobs.values()
            if j["funded"]
        ]
        return fs.team_hours(
            start=start,
            end=end,
            team_depth=team_depth,
            teams=teams,
            delivered=delivered,
            demand=demand,
            capacity=self.capacity_spans(),
            allocation_by_hour=allocation,
        )

    def capacity_spans(self) -> list[fs.Span]:
        """Each node's spans in a delivering state, with its registered GPU count."""
        out: list[fs.Span] = []
        by_node: dict[str, list[Row]] = {}
        for h in self.node_history:
            by_node.setdefault(h["node"], []).append(h)
        for node, rows in by_node.items():
            gpus = 0
            for k, h in enumerate(rows):
                if h["gpus"] is not None:
                    gpus = h["gpus"]
                nxt = rows[k + 1]["changed_at"] if k + 1 < len(rows) else None
                if h["state"] in _DELIVERING:
                    out.append(fs.Span(node, gpus, h["changed_at"], nxt))
        return out

    def delivered_report(self, start: float, end: float, team_depth: int = 2) -> fs.DeliveredReport:
        return fs.summarise(self.team_hours(start, end, team_depth), start, end)


def fold(events: Iterable[tuple[int, e.AnyEvent]], state: RefState | None = None) -> RefState:
    """Pure: fold (position, event) pairs, in log order, into the read models."""
    s = state if state is not None else RefState()
    for pos, ev in events:
        _apply(s, pos, ev)
        s.position = pos
    return s


def _apply(s: RefState, pos: int, ev: e.AnyEvent) -> None:
    match ev:
        case e.AccountOpened():
            s.account_history.append(
                _acct(ev.path, pos, ev, parent=ev.parent, kind=ev.kind, open=True)
            )
        case e.SharesSet():
            s.account_history.append(_acct(ev.account, pos, ev, shares=ev.shares, reason=ev.reason))
        case e.AccountClosed():
            s.account_history.append(_acct(ev.path, pos, ev, open=False, reason=ev.reason))
        case e.NodeRegistered():
            s._node_type[ev.node] = ev.gpu_type
            s.node_history.append(
                _node(
                    ev.node,
                    pos,
                    ev,
                    "active",
                    cluster=ev.cluster,
                    gpu_type=ev.gpu_type,
                    gpus=ev.gpus,
                )
            )
        case (
            e.NodeDrainRequested()
            | e.NodeDrained()
            | e.NodeReturned()
            | e.NodeRemoved()
            | e.NodeLost()
        ):
            reason = getattr(ev, "reason", "")
            s.node_history.append(
                _node(ev.node, pos, ev, _STATE_OF_NODE_EVENT[type(ev)], reason=reason)
            )
        case e.JobSubmitted():
            s.jobs[ev.job_id] = {
                "job_id": ev.job_id,
                "account": ev.account,
                "user_name": ev.user,
                "leaf": f"{ev.account}/{ev.user}",
                "gpus": ev.gpus,
                "gpu_type": ev.gpu_type,
                "cluster": ev.cluster,
                "min_runtime_s": ev.min_runtime_s,
                "funded": ev.min_runtime_s > 0,
                "resumable": ev.resumable,
                "priority": ev.priority,
                "debug": ev.debug,
                "time_limit_s": ev.time_limit_s,
                "duration_s": ev.duration_s,
                "submitted_at": ev.at,
                "submitted_position": pos,
                "status": "pending",
                "placed_at": None,
                "started_at": None,
                "checkpoint_at": None,
                "finished_at": None,
                "outcome": None,
                "exit_code": None,
                "placements": 0,
                "preemptions": 0,
                "last_position": pos,
                "held": False,
                "command": list(ev.command),
                "logs": [],
                "engine_reason": None,
                "job_name": ev.job_name,
                "workdir": ev.workdir,
                "array_job_id": ev.array_job_id,
                "array_task_id": ev.array_task_id,
                "run_started_at": None,
                "engine_job_id": None,
                "finish_reason": None,
                "finish_note": None,
            }
        case e.JobPlaced():
            job = _touch(s, ev.job_id, pos)
            job.update(status="placed", placed_at=ev.at, checkpoint_at=ev.at, run_started_at=None)
            job["placements"] += 1
            slots = [{"node": sl.node, "gpu_indices": list(sl.gpu_indices)} for sl in ev.slots]
            iv = {
                "job_id": ev.job_id,
                "start_position": pos,
                "start_at": ev.at,
                "end_position": None,
                "end_at": None,
                "end_reason": None,
                "account": job["account"],
                "user_name": job["user_name"],
                "leaf": job["leaf"],
                "gpus": job["gpus"],
                "gpu_type": s._node_type.get(ev.slots[0].node) if ev.slots else None,
                "funded": job["funded"],
                "cycle_id": ev.cycle_id,
                "slots": slots,
                "run_start_position": None,
                "run_start_at": None,
                "run_end_position": None,
                "run_end_at": None,
            }
            s.intervals.append(iv)
            s._open[ev.job_id] = iv
        case e.JobStarted():
            begun = ev.at if ev.started_at is None else ev.started_at  # the engine's own start
            _touch(s, ev.job_id, pos).update(
                status="running", started_at=begun, run_started_at=begun, logs=list(ev.logs)
            )
            run = s._open.get(ev.job_id)
            if run is not None and run["run_start_position"] is None:
                began = ev.at if ev.started_at is None else ev.started_at
                run.update(run_start_position=pos, run_start_at=began)
        case e.JobRunEnded():
            runs = [i for i in s.intervals if i["job_id"] == ev.job_id]
            if ev.run < len(runs) and runs[ev.run]["run_end_position"] is None:
                ended = ev.at if ev.ended_at is None else ev.ended_at
                iv = runs[ev.run]
                iv.update(run_end_position=pos, run_end_at=ended)
                row = s.jobs.get(ev.job_id)
                if (
                    row is not None
                    and row["status"] == "finished"
                    and ev.exit_code is not None
                    and ev.run == len(runs) - 1
                    and (
                        row["engine_reason"] == "node_failure"
                        or (
                            row["finish_reason"] == "cancelled"
                            and row["exit_code"] is None
                            and ev.by_itself
                        )
                    )
                ):  # a fenced job's real exit (atk46-23 F5), a cancelled one's own (atk54-23 F4)
                    row["exit_code"] = ev.exit_code
                kept = ev.at <= iv["start_at"] + fs.OWN_START_KEPT_S
                if ev.started_at is not None and iv["run_start_position"] is None and kept:
                    # its own start, where no JobStarted said it (atk44s F3)
                    iv.update(run_start_position=pos, run_start_at=max(iv["start_at"], ev.started_at))  # fmt: skip  # noqa: E501
        case e.JobHeld() | e.JobReleased():
            _touch(s, ev.job_id, pos)["held"] = isinstance(ev, e.JobHeld)
        case e.JobEngineEnded():
            _touch(s, ev.job_id, pos)["engine_reason"] = ev.reason
            runs = [i for i in s.intervals if i["job_id"] == ev.job_id]
            if runs and runs[-1]["run_end_position"] is None and not e.fenced(ev):
                ended = ev.at if ev.ended_at is None else ev.ended_at
                runs[-1].update(run_end_position=pos, run_end_at=ended)
        case e.JobEngineLinked():
            _touch(s, ev.job_id, pos)["engine_job_id"] = ev.engine_job_id
        case e.JobPreempted():
            job = _touch(s, ev.job_id, pos)
            job.update(placed_at=None, started_at=None)
            job["preemptions"] += 1
            closed = _close(s, ev.job_id, pos, ev.at, "preempted")
            s.preemptions.append(
                {
                    "position": pos,
                    "preempted_at": ev.at,
                    "job_id": ev.job_id,
                    "reason": ev.reason,
                    "for_job": ev.for_job,
                    "cycle_id": ev.cycle_id,
                    "note": ev.note,
                    "actor": ev.actor,
                    "account": job["account"],
                    "user_name": job["user_name"],
                    "leaf": job["leaf"],
                    "gpus": job["gpus"],
                    "funded": job["funded"],
                    "resumable": job["resumable"],
                    "placed_at": closed["start_at"] if closed else None,
                }
            )
        case e.JobRequeued():
            _touch(s, ev.job_id, pos)["status"] = "pending"
        case e.JobUnplaced():  # a run taken back unstarted: pending again, no preemption
            _touch(s, ev.job_id, pos).update(status="pending", placed_at=None, started_at=None)
            _close(s, ev.job_id, pos, ev.at, "unplaced")
        case e.JobFinished():
            ended = ev.at if ev.ended_at is None else ev.ended_at
            _touch(s, ev.job_id, pos).update(
                status="finished",
                finished_at=ended,
                outcome=ev.outcome,
                exit_code=ev.exit_code,
                finish_reason=ev.reason,
                finish_note=ev.note,
            )
            _close(s, ev.job_id, pos, ended, ev.outcome)
        case e.CheckpointReported():
            _touch(s, ev.job_id, pos)["checkpoint_at"] = ev.at
        case e.CycleDecided():
            s.decisions.append(
                {
                    "position": pos,
                    "decided_at": ev.at,
                    "cycle_id": ev.cycle_id,
                    "based_on": ev.based_on,
                    "policy_version": ev.policy_version,
                    "placed_jobs": list(ev.placed),
                    "preempted_jobs": list(ev.preempted),
                    "considered": ev.waiting.considered,
                    "fragmentation_gpus": ev.fragmentation_gpus,
                    "policy": msgspec.to_builtins(ev.policy),
                }
            )
        case _:
            pass


def _acct(path: str, pos: int, ev: e.Event, **cols: Any) -> Row:
    row: Row = {
        "account": path,
        "position": pos,
        "changed_at": ev.at,
        "tag": tag_of(type(ev)),
        "parent": None,
        "kind": None,
        "shares": None,
        "open": None,
        "reason": "",
    }
    row.update(cols)
    return row


def _node(node: str, pos: int, ev: e.Event, state: str, **cols: Any) -> Row:
    row: Row = {
        "node": node,
        "position": pos,
        "changed_at": ev.at,
        "tag": tag_of(type(ev)),
        "cluster": None,
        "gpu_type": None,
        "gpus": None,
        "state": state,
        "reason": "",
    }
    row.update(cols)
    return row


def _touch(s: RefState, job_id: int, pos: int) -> Row:
    job = s.jobs[job_id]
    job["last_position"] = pos
    return job


def _close(s: RefState, job_id: int, pos: int, at: float, reason: str) -> Row | None:
    iv = s._open.pop(job_id, None)
    if iv is not None:
        iv.update(end_position=pos, end_at=at, end_reason=reason)
    return iv
