"""atk52-23 F6: what a second `cancel` says of the SIGKILL it ordered, from the node view's
`heard_from` (`ledger.cli.submit.kill_words`): "killed now" only where the node's agent is heard
from; a run on a silent node's kill is owed until its agent is back."""

from __future__ import annotations

from ledger.cli.submit import SILENT_S, kill_words
from schemas import views as v


def row(
    node: str, heard: float | None, jobs: tuple[int, ...] = (), stopping: tuple[int, ...] = ()
) -> v.NodeRow:
    return v.NodeRow(node=node, cluster="c", gpu_type="sim", gpus=2, free_gpus=0, state="active",
                     jobs=list(jobs), stopping_jobs=list(stopping), heard_from=heard)  # fmt: skip


def test_a_kill_on_nodes_heard_from_is_killed_now() -> None:
    rows = [row("a", 95.0, stopping=(1,)), row("b", None, stopping=(1,))]  # b: not known
    assert kill_words(rows, [1], 100.0) == "killed now"


def test_a_kill_on_a_silent_node_says_since_when_and_that_it_waits_for_the_agent() -> None:
    rows = [row("a", 40.0, stopping=(1,)), row("b", 99.0, jobs=(1,)), row("c", 10.0, jobs=(2,))]
    said = kill_words(rows, [1], 100.0)
    assert said.startswith("SIGKILL ordered, not sent yet: a's agent has not been heard from "
                           "since 1970-01-01 00:00:40Z (60 s ago); it is sent when the agent is "
                           "back"), said  # fmt: skip
    assert "b's" not in said and "c's" not in said  # b beats; c holds another job


def test_the_silence_starts_past_silent_s() -> None:
    rows = [row("a", 100.0 - SILENT_S, stopping=(1,))]
    assert kill_words(rows, [1], 100.0) == "killed now"
    assert kill_words(rows, [1], 100.5) != "killed now"
