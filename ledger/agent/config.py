"""`gpuledger agent`'s configuration: one TOML file, every key below, flags override it.

Unknown keys are rejected, as in serve's config (`ledger.wire.config`, which loads both).
The documented example is `examples/agent.toml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from ledger.wire import config as serve_config
from schemas.units import Duration, Interval

EXAMPLE = "examples/agent.toml"


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every key of the agent's config file (all optional)."""

    node: str = ""
    """The node's name in the ledger; "" takes this host's short name."""
    url: str = ""
    """The server: http(s)://HOST:PORT (or unix:/PATH on the server's host)."""
    token: str = ""
    """The node token (`gpuledger token create --node NAME`); prefer `token_file`."""
    token_file: str = ""
    """A file holding the node token (only its owner may read it)."""
    gpus: int = 0
    """GPUs of the node; 0 asks NVML (an error where NVML is absent)."""
    gpu_type: str = ""
    """GPU type; "" asks NVML (the first GPU's name), else "gpu"."""
    address: str = ""
    """Where other nodes reach this one (MASTER_ADDR of gang jobs whose rank 0 runs here);
    "" lets the server use the address the agent connects from."""
    state_dir: str = "/var/lib/gpuledger/agent"
    """The state file of handles, the per-job run directories and the lock."""
    log_dir: str = ""
    """Per-job logs (`job-<id>.log`); "" = `<state_dir>/jobs`."""
    run_as: Literal["submitter", "service"] = "submitter"
    """As root: run jobs as the submitting OS user, or as the agent's own user."""
    grace: Duration = Duration("30s")
    """SIGTERM-to-SIGKILL grace when a job is stopped (a job's own --grace wins)."""
    debug_limit: Duration = Duration("15m")
    """Debug-lane jobs are stopped after at most this long."""
    sample_every: Interval = Interval("30s")
    """GPU utilisation sampling period."""
    utilisation_dir: str = ""
    """The test source of utilisation where NVML is absent (a file per job, see docs/agent.md);
    "" = `<state_dir>/utilisation`."""
    heartbeat: Interval = Interval("5s")
    """Time between heartbeats (keep it well inside the server's `node_lost_after`)."""
    poll_wait: Interval = Interval("20s")
    """How long one long-poll for placements may wait at the server (at most 30 s)."""
    check_every: Interval = Interval("0.2s")
    """How often the agent looks at its job processes (exits, time limits, checkpoints)."""
    log_format: Literal["text", "json"] = "text"
    """Log lines as text or as one JSON object per line."""
    log_level: str = "INFO"
    """Python log level name."""


def load(path: Path | None) -> AgentConfig:
    """The config file as an AgentConfig (defaults when `path` is None); one clear error line."""
    return serve_config.load_as(AgentConfig, path, EXAMPLE)


def merge(config: AgentConfig, **flags: object) -> AgentConfig:
    """Flags given on the command line (not None) override the file."""
    return serve_config.merge(config, **flags)


def keys() -> dict[str, str]:
    """Key -> its documentation, for the docs drift test."""
    return serve_config.keys(AgentConfig)
