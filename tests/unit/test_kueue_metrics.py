"""The Kueue-named metrics (`ledger.server.metrics.kueue_families`): Kueue's names, types and
labels, a team as the ClusterQueue and its program as the cohort."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ledger.server import metrics as m

FIGURES = m.KueueFigures(
    pending=[("ai2/olmo", "active", 5), ("ai2/olmo", "inadmissible", 1), ("ai2/tulu", "active", 2)],
    admitted=[("ai2/olmo", 9), ("ai2/tulu", 3)],
    active=[("ai2/olmo", 2)],
    evicted=[("ai2/tulu", "fairness", 2), ("ai2/tulu", "maintenance", 1)],
    preempted=[("ai2/olmo", "fairness", 2), ("", "maintenance", 1)],
    usage=[("ai2/olmo", "h100", 16)],
)


class _One(Collector):
    def collect(self):  # type: ignore[no-untyped-def]
        yield from m.kueue_families(FIGURES)


def parsed() -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_One())
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        out[fam.name] = (fam.type, {tuple(sorted(s.labels.items())): s.value for s in fam.samples})
    return out


def test_kueue_names_types_and_labels() -> None:
    got = parsed()
    assert {k: t for k, (t, _) in got.items()} == {
        "kueue_pending_workloads": "gauge",
        "kueue_admitted_workloads": "counter",
        "kueue_admitted_active_workloads": "gauge",
        "kueue_evicted_workloads": "counter",
        "kueue_preempted_workloads": "counter",
        "kueue_cluster_queue_resource_usage": "gauge",
    }
    pending = got["kueue_pending_workloads"][1]
    assert pending[(("cluster_queue", "ai2/olmo"), ("status", "inadmissible"))] == 1
    usage = got["kueue_cluster_queue_resource_usage"][1]
    assert usage == {
        (
            ("cluster_queue", "ai2/olmo"),
            ("cohort", "ai2"),
            ("flavor", "h100"),
            ("resource", "nvidia.com/gpu"),
        ): 16
    }
    caused = got["kueue_preempted_workloads"][1]
    assert caused[(("preempting_cluster_queue", ""), ("reason", "maintenance"))] == 1
