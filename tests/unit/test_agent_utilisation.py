"""Where utilisation samples come from (`ledger.engines.gpu_util`).

This machine has no GPU and no NVIDIA driver: `pick_source` falls back to the test source here,
which is what CI and the live tests use. The NVML source's own mapping (GPU index -> handle ->
`.gpu`, an NVML error -> no sample) is checked against a stand-in for the binding; the real
binding is only reached on a GPU node."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.agent.host import gpus_from_nvml
from ledger.engines.gpu_util import FileSource, NvmlSource, pick_source


@pytest.mark.parametrize(
    ("text", "gpus", "want"),
    [
        ("0", (0, 1), (0.0, 0.0)),  # once for every GPU of the job
        ("95 90", (2, 3), (95.0, 90.0)),  # once per GPU, in the job's GPU order
        ("95,90", (2, 3), (95.0, 90.0)),
        ("95 90 1", (2, 3), None),  # a count that fits no GPU list: no sample
        ("101", (0,), None),  # outside 0..100
        ("idle", (0,), None),  # not numbers
    ],
)
def test_the_test_source_reads_a_file_per_job(
    tmp_path: Path, text: str, gpus: tuple[int, ...], want: tuple[float, ...] | None
) -> None:
    (tmp_path / "7").write_text(text)
    assert FileSource(tmp_path).sample(7, gpus) == want


def test_a_job_with_no_file_has_no_sample(tmp_path: Path) -> None:
    assert FileSource(tmp_path).sample(8, (0,)) is None  # unknown is not idle
    assert FileSource(tmp_path / "missing").sample(8, (0,)) is None


def test_nvml_is_used_where_it_works_and_the_test_source_everywhere_else(tmp_path: Path) -> None:
    found = gpus_from_nvml()
    source = pick_source(tmp_path)
    if found is None:  # this machine and CI: no driver, so the agent needs --gpus
        assert isinstance(source, FileSource)
        assert source.name == f"test source (files in {tmp_path})"
    else:  # a GPU node
        assert isinstance(source, NvmlSource) and source.count == found[0]


class FakeNvml:
    """The few calls of nvidia-ml-py (its own names) that NvmlSource makes, over a table."""

    class NVMLError(Exception):
        pass

    def __init__(self, util: dict[int, int]) -> None:
        self.util = util

    def nvmlDeviceGetCount(self) -> int:
        return len(self.util)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        if i not in self.util:
            raise self.NVMLError(f"no GPU {i}")
        return i

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=self.util[handle], memory=0)


def test_the_nvml_source_samples_the_jobs_gpus_by_index() -> None:
    source = NvmlSource(FakeNvml({0: 3, 1: 97, 2: 50}))
    assert source.name == "NVML (3 GPUs)"
    assert source.sample(1, (1, 0)) == (97.0, 3.0)
    assert source.sample(1, (5,)) is None  # an NVML error is no sample, never a crash
