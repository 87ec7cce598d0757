"""A stopped run Slurm no longer lists (its state lost, or purged): its end comes from its own
marks (`stops.forgotten_end`, pure; `launching.forgotten_stop`). Before, such a stop was
dropped with no end reported: after a slurmctld state loss and a drain's preemption, the run's
end was never recorded and its job waited for good (test_slurm_ctldloss at load)."""

from __future__ import annotations

from ledger.engines.slurm.ends import OwnEnd
from ledger.engines.slurm.stops import Stopping, forgotten_end

ST = Stopping(since=100.0, run=(1, 0))


def test_its_own_end_record_says_how_and_when_it_ended() -> None:
    end = forgotten_end(ST, "42", OwnEnd(0, 103.5, signalled=True), 103.0, 200.0, 17.0)
    assert end is not None
    assert (end.job_id, end.run, end.exit_code, end.at, end.engine_job_id) == (1, 0, 0, 103.5, "42")
    assert "its own end record" in end.note


def test_without_a_record_it_is_held_while_its_beat_is_fresh_then_killed_after_it() -> None:
    assert forgotten_end(ST, "42", None, 110.0, 120.0, 17.0) is None  # may still live
    end = forgotten_end(ST, "42", None, 110.0, 128.0, 17.0)
    assert end is not None and (end.exit_code, end.at, end.engine_state) == (137, 112.0, "KILLED")


def test_without_a_record_or_a_beat_it_ended_at_its_stop() -> None:
    end = forgotten_end(ST, "42", None, None, 150.0, 17.0)
    assert end is not None and end.at == 100.0
