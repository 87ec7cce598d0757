"""What every event is built of: the base `Event` and the bases of the events about one job,
node, member or manager, the GPU slot a placement holds, and the bounds of the collections events
carry. `schemas.events` names every event (and these)."""

from __future__ import annotations

from typing import Annotated, TypeVar

import msgspec

from schemas.bounds import (
    AccountPath,
    Actor,
    Epoch,
    GpuIndices,
    JobId,
    Name,
    Token,
)


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event. Not an event itself: it has no tag."""

    event_id: Token
    at: Epoch
    actor: Actor
    prev_hash: Token = ""
    """SHA-256 (hex) of the previous event's stored bytes: the log is a hash chain, so an edited
    or removed event breaks the link after it. Empty for the first event. Set by the ledger."""
    real_actor: Actor | None = None
    """Who really called, when an admin acted as `actor` (`--as`); None when they are the same."""


class JobEvent(Event, frozen=True, kw_only=True):
    """Base of the events about one job (its id first). Not an event itself."""

    job_id: JobId


class NodeEvent(Event, frozen=True, kw_only=True):
    """Base of the events about one node (its name first). Not an event itself."""

    node: Name


class MemberEvent(Event, frozen=True, kw_only=True):
    """Base of the events about a project's member. Not an event itself."""

    user: Name
    project: AccountPath


class ManagerEvent(Event, frozen=True, kw_only=True):
    """Base of the events about who manages a subtree. Not an event itself."""

    user: Name
    account: AccountPath


class GpuSlot(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs of one node that a placement holds."""

    node: Name
    gpu_indices: GpuIndices


T = TypeVar("T")
MANY = msgspec.Meta(max_length=10_000_000)
Many = Annotated[tuple[T, ...], MANY]
"""A tuple of at most 10M items: the lists that grow with the queue (a decision's jobs)."""
LISTED = msgspec.Meta(max_length=1_024)
Slots = Annotated[tuple[GpuSlot, ...], msgspec.Meta(max_length=100_000)]
