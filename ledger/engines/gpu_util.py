"""Where GPU utilisation samples come from. An edge: reads NVML or files.

- `NvmlSource`: NVIDIA's NVML through nvidia-ml-py (`pynvml`), per GPU index of this host.
- `FileSource`, the documented test source for hosts without NVML (CI, laptops): a directory
  holding one file per job, named after the job id, e.g. `<dir>/17`, with the utilisation in
  percent either once for every GPU of the job (`0`) or once per GPU in the job's GPU order
  (`95 90 0 0`, spaces or commas). A job with no file has no sample (unknown is not idle).

`pick_source` takes NVML when it initialises, otherwise the file source; the service says at
start which one it uses.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("gpuledger.agent")


class UtilSource(Protocol):
    name: str

    def sample(self, job_id: int, gpu_indices: tuple[int, ...]) -> tuple[float, ...] | None:
        """Utilisation % of each GPU in `gpu_indices` (this host's indices) for `job_id`."""
        ...


class FileSource:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.name = f"test source (files in {directory})"

    def sample(self, job_id: int, gpu_indices: tuple[int, ...]) -> tuple[float, ...] | None:
        try:
            text = (self.directory / str(job_id)).read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            values = [float(v) for v in text.replace(",", " ").split()]
        except ValueError:
            log.warning("utilisation file of job %s is not numbers: %r", job_id, text[:40])
            return None
        if len(values) == 1:
            values *= len(gpu_indices)
        if len(values) != len(gpu_indices) or not all(0.0 <= v <= 100.0 for v in values):
            want = len(gpu_indices)
            log.warning("utilisation file of job %s: want %d values in 0..100", job_id, want)
            return None
        return tuple(values)


class NvmlSource:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.count = int(nvml.nvmlDeviceGetCount())
        self.name = f"NVML ({self.count} GPUs)"

    def sample(self, job_id: int, gpu_indices: tuple[int, ...]) -> tuple[float, ...] | None:
        try:
            return tuple(
                float(
                    self.nvml.nvmlDeviceGetUtilizationRates(
                        self.nvml.nvmlDeviceGetHandleByIndex(i)
                    ).gpu
                )
                for i in gpu_indices
            )
        except self.nvml.NVMLError as e:
            log.warning("NVML sample of job %s failed: %s", job_id, e)
            return None


def pick_source(test_dir: Path) -> UtilSource:
    """NVML when present and working, otherwise the file source in `test_dir`."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlSource(pynvml)
    except Exception:  # no library, no driver, no GPU: all mean "no NVML here"
        return FileSource(test_dir)
