"""One heavy piece of work at a time (a what-if, a job page's replay), the people waiting served
in turn (`fairlane.FairSlot`): a manager re-asking her what-if as soon as hers ended kept every
other manager's refused 429 for good (atk44-25 F2), and one person's looped replays queued in
front of another's (F3). Here the other person's waits for the one under way at most."""

from __future__ import annotations

import asyncio

import pytest

from ledger.server.fairlane import FairSlot
from schemas.errors import TooBusy


def test_a_person_looping_never_goes_before_another_waiting() -> None:
    order: list[str] = []

    async def work(slot: FairSlot, person: str, gate: asyncio.Event | None = None) -> None:
        async with slot.hold(person):
            order.append(person)
            if gate is not None:
                await gate.wait()
            await asyncio.sleep(0)

    async def go() -> None:
        slot = FairSlot("a what-if", per_person=1)
        gate = asyncio.Event()
        first = asyncio.create_task(work(slot, "ann", gate))
        await asyncio.sleep(0)
        with pytest.raises(TooBusy, match="a what-if of yours is under way"):
            async with slot.hold("ann"):  # her second at once: 429, as before
                pass
        bob = asyncio.create_task(work(slot, "bob"))  # waits its turn (was 429)
        await asyncio.sleep(0)
        gate.set()
        await first
        again = asyncio.create_task(work(slot, "ann"))  # she re-asks at once: after bob
        await asyncio.gather(bob, again)
        assert not slot.busy and not slot.waiting and not slot.held

    asyncio.run(go())
    assert order == ["ann", "bob", "ann"], order


def test_replays_many_of_one_person_wait_behind_anothers_one() -> None:
    order: list[str] = []

    async def go() -> None:
        slot = FairSlot("a replay", per_person=16)
        gate = asyncio.Event()

        async def work(person: str, wait: bool = False) -> None:
            async with slot.hold(person):
                order.append(person)
                if wait:
                    await gate.wait()

        tasks = [asyncio.create_task(work("ann", wait=True))]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(work("ann")) for _ in range(5)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(work("bob")))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(go())
    assert order[:2] == ["ann", "bob"], order  # was FIFO: bob after ann's five


def test_a_waiter_that_leaves_hands_the_slot_on() -> None:
    async def go() -> None:
        slot = FairSlot("a replay", per_person=4)
        gate = asyncio.Event()

        async def hold(person: str) -> None:
            async with slot.hold(person):
                await gate.wait()

        first = asyncio.create_task(hold("ann"))
        await asyncio.sleep(0)
        gone = asyncio.create_task(hold("bob"))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        gate.set()
        await first
        assert not slot.busy and not slot.waiting and not slot.held
        async with slot.hold("carl"):
            assert slot.busy

    asyncio.run(go())


def test_a_request_whose_client_leaves_while_it_waits_frees_its_place_at_once() -> None:
    """atk50-29 F1: a what-if waiting its turn whose client left stayed in the line, its
    person's one what-if counted as under way: her next question was refused 429 for as long as
    the what-ifs ahead ran (199 s). `children.attended_turn` attends the wait too."""
    from ledger.server import children
    from schemas.errors import Unavailable

    async def go() -> None:
        slot = FairSlot("a what-if", per_person=1)
        gate = asyncio.Event()
        left = asyncio.Event()

        async def never() -> dict[str, str]:
            await asyncio.Event().wait()  # a client that stays
            return {"type": "http.disconnect"}

        async def leaves() -> dict[str, str]:
            await left.wait()
            return {"type": "http.disconnect"}

        async def work() -> str:
            await gate.wait()
            return "done"

        async def quick() -> str:
            return "hers"

        ann = asyncio.create_task(
            children.attended_turn(never, lambda: False, slot, "ann", work, "what-if")
        )
        await asyncio.sleep(0.01)
        assert slot.busy and slot.held == {"ann": 1}
        bob = asyncio.create_task(
            children.attended_turn(leaves, lambda: False, slot, "bob", quick, "what-if")
        )
        await asyncio.sleep(0.01)
        assert slot.held == {"ann": 1, "bob": 1} and "bob" in slot.waiting
        left.set()  # bob's client leaves while ann's runs
        with pytest.raises(Unavailable, match="its caller left"):
            await asyncio.wait_for(bob, children.WATCH_S * 4)
        assert slot.held == {"ann": 1} and not slot.waiting  # his place freed at once
        again = asyncio.create_task(  # his next question waits its turn: not refused
            children.attended_turn(never, lambda: False, slot, "bob", quick, "what-if")
        )
        await asyncio.sleep(0.01)
        assert not again.done() and "bob" in slot.waiting
        gate.set()
        assert await ann == "done" and await again == "hers"
        assert not slot.busy and not slot.waiting and not slot.held

    asyncio.run(go())


def test_a_waiting_person_is_told_how_many_go_before_them() -> None:
    """atk50-29 F3: the page said "running" while a what-if only waited its turn."""

    async def go() -> None:
        slot = FairSlot("a what-if", per_person=1)
        gate = asyncio.Event()

        async def work(person: str) -> None:
            async with slot.hold(person):
                await gate.wait()

        tasks = [asyncio.create_task(work(p)) for p in ("ann", "bob", "cy")]
        await asyncio.sleep(0.01)
        assert slot.place("ann")[0] == 0 and (slot.place("ann")[1] or -1) >= 0
        assert slot.place("bob") == (1, None) and slot.place("cy") == (2, None)
        assert slot.place("dee") == (0, None)  # none of hers
        gate.set()
        await asyncio.gather(*tasks)
        assert slot.place("cy") == (0, None)

    asyncio.run(go())


def test_the_number_ahead_of_a_waiting_person_never_grows() -> None:
    """atk51-29 F4: "waiting for 1 what-if ahead of yours" became "2": a manager served longer
    ago who came later was put ahead of her (she had been served recently). Now the people
    waiting go in the order they came (each person's first waiting one; a person's further ones,
    a replay's, after everyone's first: `test_replays_many_of_one_person_wait_behind_anothers_one`),
    so a newcomer never goes before someone waiting, and her number only falls."""
    order: list[str] = []

    async def go() -> None:
        slot = FairSlot("a what-if", per_person=1)
        gates = {p: asyncio.Event() for p in ("ann", "bob", "cy", "dee")}

        async def work(person: str) -> None:
            async with slot.hold(person):
                order.append(person)
                await gates[person].wait()

        first = asyncio.create_task(work("ann"))  # ann served: her turn is the latest
        await asyncio.sleep(0)
        gates["ann"].set()
        await first
        tasks = [asyncio.create_task(work("bob"))]  # bob runs
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(work("ann")))  # ann waits behind bob's
        await asyncio.sleep(0)
        seen = [slot.place("ann")[0]]
        for p in ("cy", "dee"):  # never served: came after her
            tasks.append(asyncio.create_task(work(p)))
            await asyncio.sleep(0)
            seen.append(slot.place("ann")[0])
        for p in ("bob", "ann", "cy", "dee"):
            gates[p].set()
            await asyncio.sleep(0.01)
            seen.append(slot.place("ann")[0])
        await asyncio.gather(*tasks)
        assert seen == [1, 1, 1, 0, 0, 0, 0], seen  # was 1, 2, 3: cy and dee put ahead of her
        assert slot.place("dee") == (0, None)

    asyncio.run(go())
    assert order == ["ann", "bob", "ann", "cy", "dee"], order


def test_what_a_persons_piece_is_about_is_known_while_it_waits_or_runs() -> None:
    """atk53-29 F6: a second tab of hers knew nothing of the what-if her first tab asked. The
    slot keeps what each person's piece is about (`asked`) while it waits or runs, and a
    refused second piece of hers (429) leaves the first's."""

    async def go() -> None:
        slot = FairSlot("a what-if", per_person=1)
        gate = asyncio.Event()

        async def work(person: str, about: object) -> None:
            async with slot.hold(person, about):
                await gate.wait()

        ann = asyncio.create_task(work("ann", {"account": "p/a", "shares": 3}))
        await asyncio.sleep(0)
        bob = asyncio.create_task(work("bob", {"account": "p/b", "shares": 5}))  # waits
        await asyncio.sleep(0)
        with pytest.raises(TooBusy):
            async with slot.hold("ann", {"account": "p/c", "shares": 9}):
                pass
        assert slot.asked("ann") == {"account": "p/a", "shares": 3}
        assert slot.asked("bob") == {"account": "p/b", "shares": 5}
        assert slot.asked("cat") is None
        gate.set()
        await asyncio.gather(ann, bob)
        assert slot.asked("ann") is None and slot.asked("bob") is None

    asyncio.run(go())


def test_each_piece_is_numbered_and_its_persons_last_end_is_kept_for_a_while() -> None:
    """atk55-29 F1: a tab of hers that saw her what-if under way, and found none at its next
    look, said it had ended, though it was lost with a server killed and started again. The
    slot numbers each piece (`number`) and keeps each person's last end (`ended`: its number,
    what it was about, ok / failed / stopped) for `keep_s`, so a tab tells an end of the one it
    saw from none (a new start numbers from 1 and has no end of hers)."""
    now = [100.0]

    async def go() -> None:
        slot = FairSlot("a what-if", per_person=1, keep_s=60.0, clock=lambda: now[0])
        gate = asyncio.Event()

        async def work(person: str, about: object, fail: bool = False) -> None:
            async with slot.hold(person, about):
                await gate.wait()
                if fail:
                    raise ValueError("its child failed")

        ann = asyncio.create_task(work("ann", {"account": "p/a", "shares": 3}))
        await asyncio.sleep(0)
        bob = asyncio.create_task(work("bob", {"account": "p/b", "shares": 5}, fail=True))
        await asyncio.sleep(0)
        cy = asyncio.create_task(work("cy", {"account": "p/c", "shares": 1}))  # leaves waiting
        await asyncio.sleep(0)
        assert (slot.number("ann"), slot.number("bob"), slot.number("cy")) == (1, 2, 3)
        assert slot.ended("ann") is None and slot.number("dee") is None
        cy.cancel()
        now[0] = 110.0
        gate.set()
        await ann
        with pytest.raises(ValueError):
            await bob
        with pytest.raises(asyncio.CancelledError):
            await cy
        assert slot.number("ann") is None
        ended = {p: slot.ended(p) for p in ("ann", "bob", "cy")}
        assert {p: (e.number, e.how, e.about["account"]) for p, e in ended.items() if e} == {
            "ann": (1, "ok", "p/a"),
            "bob": (2, "failed", "p/b"),
            "cy": (3, "stopped", "p/c"),
        }
        again = asyncio.create_task(work("ann", {"account": "p/a", "shares": 4}))
        await again
        assert slot.ended("ann").number == 4  # her last
        now[0] = 175.0  # past keep_s
        assert slot.ended("ann") is None and slot.ended("bob") is None

    asyncio.run(go())
