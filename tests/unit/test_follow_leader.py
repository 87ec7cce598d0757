"""Clients and agents follow the leader of a list of servers (docs/ha.md), against small real
HTTP servers on 127.0.0.1: a standby's 503 sends them to the leader it names, a refused
connection to the next server, a retried write carries its first try's Idempotency-Key, a read
asks for the position of the client's last write; an agent never takes a deposed leader's list;
a dispatcher whose lease ran out carries out nothing."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest

from ledger.agent.client import AgentClient, Seen
from ledger.cycle.dispatcher import Dispatcher
from ledger.cycle.executor import Launch, Orders
from ledger.wire.client import Client
from schemas import agent as a
from schemas import commands as c
from schemas.errors import Unavailable


class Fake:
    """One fake server: answers from `answer(method, path, headers)`; remembers the requests."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.answer: Any = lambda method, path, headers: (200, {}, b"{}")
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.seen.append((self.command, self.path, headers))
                status, extra, body = fake.answer(self.command, self.path, headers)
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes() -> Iterator[tuple[Fake, Fake]]:
    x, y = Fake(), Fake()
    yield x, y
    x.close()
    y.close()


def standby(leader: str) -> Any:
    problem = {"title": "unavailable", "status": 503, "detail": "standby", "code": "unavailable"}
    body = json.dumps(problem | {"message": "this server is a standby"}).encode()
    return lambda *_: (503, {"X-Gpuledger-Leader": leader}, body)


def refused_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed at once: nobody listens


def test_a_standby_sends_the_client_to_the_leader_and_reads_ask_for_the_last_write(
    fakes: tuple[Fake, Fake],
) -> None:
    stand, lead = fakes
    stand.answer = standby(lead.url)
    result = json.dumps({"position": 42, "events": []}).encode()
    lead.answer = lambda *_: (200, {"X-Gpuledger-Position": "42"}, result)
    client = Client(f"{stand.url},{lead.url}", "tok")
    client.execute(c.SubmitJob(actor="", account="a/b", gpus=1, min_runtime_s=60))
    assert client.url == lead.url and client.position == 42
    [(_, _, first)] = stand.seen
    (_, _, second), = lead.seen  # fmt: skip
    assert first["idempotency-key"] == second["idempotency-key"]  # the same write, sent again
    lead.answer = lambda *_: (200, {"X-Gpuledger-Position": "50"}, b"[]")
    client.get("jobs")
    assert lead.seen[-1][2]["x-gpuledger-min-position"] == "42"
    assert client.position == 50
    client.close()


def test_a_leader_named_by_a_server_of_the_list_is_followed_though_the_list_lacks_it(
    fakes: tuple[Fake, Fake],
) -> None:
    # atk38-28 F2: a standby that did not win a takeover names its successor; a CLI whose list
    # lacks it failed in 5 s (or waited out the frozen leader). F2b: an agent told "the leader
    # is X" by the standbys of its --url never went to X, and its node was counted lost.
    stand, lead = fakes
    stand.answer = standby(lead.url)
    result = json.dumps({"position": 7, "events": []}).encode()
    lead.answer = lambda *_: (200, {"X-Gpuledger-Position": "7"}, result)
    client = Client(stand.url, "tok")  # a list of one: the standby
    client.execute(c.SubmitJob(actor="", account="a/b", gpus=1, min_runtime_s=60))
    [(_, _, first)] = stand.seen
    (_, _, second), = lead.seen  # fmt: skip
    assert second["idempotency-key"] == first["idempotency-key"]  # the same write
    assert second["authorization"] == "Bearer tok"  # authenticated as the listed ones
    assert client.url == lead.url and client.urls == [stand.url, lead.url]
    client.close()
    asg = a.Assignment(node="n", version="v", parts=(), server_time=0.0, epoch=4)
    lead.answer = lambda *_: (200, {}, msgspec.json.encode(asg))
    agent = AgentClient(stand.url, "node-tok", 10)
    assert agent.poll("n", "", 0)[0].epoch == 4
    assert lead.seen[-1][2]["authorization"] == "Bearer node-tok"
    agent.client.close()
    # never to a Unix socket, nor from https to http, whoever names it
    stand.answer = standby("unix:/tmp/elsewhere")
    with pytest.raises(Unavailable, match="standby"):
        Client(stand.url, "tok").get("jobs")


def test_a_refused_connection_goes_to_the_next_server_even_for_a_write_without_a_key(
    fakes: tuple[Fake, Fake],
) -> None:
    _, lead = fakes
    lead.answer = lambda *_: (200, {}, b'{"ok": true}')
    client = Client(f"{refused_url()},{lead.url}", "tok")
    assert client.post("agent/heartbeat", {"node": "n"}) == {"ok": True}
    client.close()


def test_one_server_gives_up_at_once_and_a_list_gives_up_after_the_retry_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(Unavailable, match="cannot reach"):
        Client(refused_url()).get("health")
    monkeypatch.setenv("GPULEDGER_RETRY_S", "0.5")
    import time

    began = time.monotonic()
    with pytest.raises(Unavailable):
        Client(f"{refused_url()},{refused_url()}").get("health")
    assert 0.5 <= time.monotonic() - began < 10


def _away(unknown: bool) -> Any:
    said = "PostgreSQL does not commit: no write is taken until it does; reads still answer"
    problem = {"title": "unavailable", "status": 503, "detail": said, "code": "unavailable"}
    extra = {"X-Gpuledger-Store": "away"} | ({"X-Gpuledger-Outcome": "unknown"} if unknown else {})
    return lambda *_: (503, extra, json.dumps(problem | {"message": said}).encode())


def test_a_write_that_may_be_stored_is_asked_again_under_its_key_and_never_said_refused(
    fakes: tuple[Fake, Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try that a server said may be stored (`X-Gpuledger-Outcome: unknown`, or an answer
    lost): the next server's "no write is taken" is not the write's fate (atk50b-ha F1). The
    client asks again under the same key until its retry time, then says the outcome is unknown
    and names the key; a server that answers meanwhile answers it."""
    monkeypatch.setenv("GPULEDGER_RETRY_S", "0.6")
    x, y = fakes
    x.answer, y.answer = _away(True), _away(False)
    cmd = c.CancelJob(actor="", job_id=1)
    with pytest.raises(Unavailable, match="outcome is unknown") as got:
        Client(f"{x.url},{y.url}", "tok").execute(cmd)
    keys = {h["idempotency-key"] for _, _, h in x.seen + y.seen}
    assert len(keys) == 1 and got.value.fields["key"] in keys and len(y.seen) > 1
    assert "no write is taken" not in got.value.line()
    # a cancel is not sent again as a submit: its hint says how to tell whether it was applied
    assert "gpuledger submit" not in got.value.line() and "gpuledger log" in got.value.line()
    # without a try that may be stored, the refusal is said at once
    x.seen.clear()
    x.answer = _away(False)
    with pytest.raises(Unavailable, match="no write is taken"):
        Client(f"{x.url},{y.url}", "tok").execute(cmd)


def test_a_server_that_closed_on_a_read_request_leaves_the_write_in_doubt_though_it_is_gone(
    fakes: tuple[Fake, Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader killed -9 in its commit had read the whole request, so its socket closes
    cleanly (the client reads `RemoteDisconnected`, not a reset), and the client's one more
    try on a new connection is refused: the write may be stored all the same. Before, that
    refusal made it "never arrived", so the next server's "no write is taken" was said as its
    fate (stop 61's CI, test_pg_outage_in_doubt); a keyless write was sent to the next server
    again."""
    import socket

    monkeypatch.setenv("GPULEDGER_RETRY_S", "0.6")
    _, y = fakes
    y.answer = _away(False)
    dying = socket.socket()
    dying.bind(("127.0.0.1", 0))
    dying.listen()
    url = f"http://127.0.0.1:{dying.getsockname()[1]}"

    def read_then_die() -> None:  # reads the request whole, then closes: its port refuses
        conn, _ = dying.accept()
        conn.recv(65536)
        dying.close()
        conn.close()

    threading.Thread(target=read_then_die, daemon=True).start()
    cmd = c.CancelJob(actor="", job_id=1)
    with pytest.raises(Unavailable, match="outcome is unknown") as got:
        Client(f"{url},{y.url}", "tok").execute(cmd)
    assert "no write is taken" not in got.value.line() and y.seen
    # a write without a key is not sent on to the next server: it may have been applied
    y.seen.clear()
    dying = socket.socket()
    dying.bind(("127.0.0.1", 0))
    dying.listen()
    url = f"http://127.0.0.1:{dying.getsockname()[1]}"
    threading.Thread(target=read_then_die, daemon=True).start()
    with pytest.raises(Unavailable, match="cannot reach"):
        Client(f"{url},{y.url}", "tok").post("x/write", {"a": 1})
    assert y.seen == []


def test_a_submit_in_doubt_is_told_to_send_it_again_under_its_key() -> None:
    from ledger.wire.client import _in_doubt

    away = Unavailable("the store does not answer: no write is taken until it does")
    said = _in_doubt(away, "http://a:1", "k1", "/v1/commands/submit").line()
    assert "outcome is unknown" in said and "`gpuledger submit --idempotency-key k1`" in said
    assert _in_doubt(away, "", "k1", "/v1/commands/submit") is away  # it reached no server


def test_a_client_finds_a_new_leader_within_a_quarter_second_of_it_answering(
    fakes: tuple[Fake, Fake],
) -> None:
    """A failover in progress: every server answers 503 naming no leader for 3.2 s, then one
    leads. The client's pause between rounds stays short: it is answered within ~0.25 s of the
    new leader (a pause growing to 1 s answered it 0.8 s later)."""
    x, y = fakes
    nobody = standby("")
    result = json.dumps({"position": 7, "events": []}).encode()
    switch = time.monotonic() + 3.2

    def leads_later(*args: Any) -> Any:
        return (200, {}, result) if time.monotonic() >= switch else nobody(*args)

    x.answer, y.answer = nobody, leads_later
    client = Client(f"{x.url},{y.url}", "tok")
    client.execute(c.SubmitJob(actor="", account="a/b", gpus=1, min_runtime_s=60))
    assert client.url == y.url
    assert time.monotonic() - switch < 0.6
    client.close()


def test_an_agent_never_takes_a_list_from_an_older_leader_epoch(fakes: tuple[Fake, Fake]) -> None:
    server, _ = fakes
    epoch = [3]

    def assignment(*_: object) -> tuple[int, dict[str, str], bytes]:
        asg = a.Assignment(node="n", version="v", parts=(), server_time=0.0, epoch=epoch[0])
        return 200, {}, msgspec.json.encode(asg)

    server.answer = assignment
    seen = Seen()
    agent = AgentClient(server.url, "tok", 10, seen)
    assert agent.poll("n", "", 0)[0].epoch == 3 and seen.epoch == 3
    epoch[0] = 2  # a deposed leader answers
    with pytest.raises(Unavailable, match="leader epoch 2 answered after epoch 3"):
        AgentClient(server.url, "tok", 10, seen).poll("n", "", 0)
    epoch[0] = 0  # a single server (no lease) is not fenced
    assert agent.poll("n", "", 0)[0].epoch == 0
    agent.client.close()


class Recording:
    engine = "test"

    def __init__(self) -> None:
        self.orders: list[Orders] = []

    def carry_out(self, orders: Orders, now: float) -> tuple[()]:
        self.orders.append(orders)
        return ()


def test_a_dispatcher_whose_lease_ran_out_carries_out_nothing_and_passes_its_epoch() -> None:
    ex = Recording()
    from types import SimpleNamespace

    ledger = SimpleNamespace(state=SimpleNamespace(jobs={}, stopped_runs={}))  # no starts, no kills
    d = Dispatcher(ledger, None, None, ex)  # type: ignore[arg-type]
    orders = Orders(launches=(Launch(1, (), ("true",), 60.0, "u", "a/b"),))
    d.epoch, d.may_act = 7, lambda: False
    d.carry_out(orders, 0.0)
    assert ex.orders == []
    d.may_act = lambda: True
    d.carry_out(Orders(stops=(1,)), 0.0)
    assert ex.orders == [Orders(stops=(1,), epoch=7)]


def _standby_front(leader: str) -> Any:
    """An HAFront of a standby that names `leader` and may not act (a fake HA state)."""
    from types import SimpleNamespace

    from ledger.server.ha_front import HAFront

    ha = SimpleNamespace(
        acting=lambda: False,
        leader_address=lambda: leader,
        lease=SimpleNamespace(address="http://me:1", may_act=lambda: False),
        role="standby",
        unreachable=None,
        away=lambda: None,
        notify=lambda: None,
        taking_up=lambda: None,
        held_back=None,
    )
    return HAFront(None, ha, lambda: 0)  # type: ignore[arg-type]


def test_a_standby_never_forwards_a_write_that_was_forwarded_to_it() -> None:
    """Two standbys that each name the other as leader (each read the lease at another moment)
    refuse a forwarded write instead of bouncing it between them."""
    import asyncio

    front = _standby_front("http://other:1")

    async def forward(*args: object) -> None:
        raise AssertionError("forwarded again")

    front._forward = forward  # type: ignore[method-assign]
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}"}

    headers = [(b"authorization", b"Bearer x"), (b"x-gpuledger-forwarded", b"1")]
    scope = {"type": "http", "method": "POST", "path": "/v1/commands/submit", "headers": headers,
             "query_string": b""}  # fmt: skip
    asyncio.run(front(scope, receive, send))
    assert sent[0]["status"] == 503
    assert (b"x-gpuledger-leader", b"http://other:1") in sent[0]["headers"]


@pytest.mark.parametrize(
    ("holds", "leader", "unreachable", "served"),
    [
        (True, "http://me:1", None, True),  # took the lease; the worker takes up the work
        (False, "", None, True),  # nobody leads: an election is on, and this server wins it
        (False, "http://other:1", None, False),  # another leads: forwarded at once, no wait
        (False, "", "the store does not answer", False),  # no election without the store
    ],
)
def test_a_write_waits_for_a_server_about_to_lead_and_for_nothing_else(
    holds: bool, leader: str, unreachable: str | None, served: bool
) -> None:
    """A server listens before its first turn takes the lease: a write in between waits for
    it (it used to be refused naming the server itself as the leader); a standby with a
    leader elsewhere, or a store that does not answer, does not wait."""
    import asyncio
    from types import SimpleNamespace

    from ledger.server import ha_front as ha_module
    from ledger.server.ha_front import HAFront

    turns = {"n": 0}

    def acting() -> bool:  # the worker takes up the leader's work after a few turns
        turns["n"] += 1
        return (holds or not leader) and unreachable is None and turns["n"] > 3

    ha = SimpleNamespace(
        acting=acting,
        leader_address=lambda: leader,
        lease=SimpleNamespace(address="http://me:1", may_act=lambda: holds),
        role="standby",
        unreachable=unreachable,
        away=lambda: unreachable,
        notify=lambda: None,
    )
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append("app")
        await send({"type": "http.response.start", "status": 200, "headers": []})

    front = HAFront(app, ha, lambda: 0)  # type: ignore[arg-type]

    async def forward(*args: object) -> None:
        reached.append("forwarded")

    front._forward = forward  # type: ignore[method-assign]
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}"}

    scope = {"type": "http", "method": "POST", "path": "/v1/commands/submit", "query_string": b"",
             "headers": [(b"authorization", b"Bearer x")]}  # fmt: skip
    began = time.monotonic()
    asyncio.run(front(scope, receive, send))
    if served:
        assert reached == ["app"]
    else:
        assert "app" not in reached
        assert time.monotonic() - began < ha_module.TAKEOVER_WAIT_S  # no wait


def test_a_server_that_accepts_and_never_answers_is_left_for_the_next_and_the_next_request_starts_there(  # noqa: E501
    fakes: tuple[Fake, Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen server (SIGSTOP: the kernel still accepts connections) holds a client only for
    the list's per-server timeout, even when that is longer than the retry time."""
    import socket
    import time

    import ledger.wire.client as wire

    _, lead = fakes
    lead.answer = lambda *_: (200, {}, b"[]")
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)  # accepts (the backlog), never reads
    monkeypatch.setattr(wire, "LIST_TIMEOUT_S", 0.5)
    monkeypatch.setenv("GPULEDGER_RETRY_S", "0")
    client = Client(f"http://127.0.0.1:{frozen.getsockname()[1]},{lead.url}", "tok")
    began = time.monotonic()
    assert client.get("jobs") == []
    assert time.monotonic() - began < 5 and client.url == lead.url
    frozen.close()
    client.close()


def busy(after: str) -> Any:
    problem = {"title": "busy", "status": 429, "detail": "'root' has 2 queries running already",
               "code": "busy", "message": "'root' has 2 queries running already"}  # fmt: skip
    return lambda *_: (429, {"Retry-After": after}, json.dumps(problem).encode())


def test_a_busy_answer_is_waited_out_within_retry_s_and_said_past_it(
    fakes: tuple[Fake, Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read answered 429 (the person's reads at once are used, e.g. by their own dashboard)
    is asked again after Retry-After, and answered; a write without an idempotency key never
    (it may not be sent twice); past GPULEDGER_RETRY_S the server's line is raised at once."""
    from schemas.errors import TooBusy

    x, _ = fakes
    answers = [busy("1"), lambda *_: (200, {}, b'{"ok": 1}')]
    x.answer = lambda *a: answers.pop(0)(*a) if len(answers) > 1 else answers[0](*a)
    client = Client(x.url)
    t0 = time.monotonic()
    assert client.get("queue") == {"ok": 1}
    assert time.monotonic() - t0 >= 1.0 and len(x.seen) == 2

    x.seen.clear()
    x.answer = busy("1")
    with pytest.raises(TooBusy, match="2 queries running already"):
        client.post("batch", {})  # no key: refused at once
    assert len(x.seen) == 1

    x.seen.clear()  # a read asked with a body (a budget plan, admitted as a read: atk44-25 F6)
    answers[:] = [busy("1"), lambda *_: (200, {}, b'{"ok": 2}')]
    x.answer = lambda *a: answers.pop(0)(*a) if len(answers) > 1 else answers[0](*a)
    assert client.post("budget/plan", {}, read=True) == {"ok": 2}
    assert len(x.seen) == 2

    x.seen.clear()
    monkeypatch.setenv("GPULEDGER_RETRY_S", "2")
    x.answer = busy("5")  # longer than the client waits: said at once
    t0 = time.monotonic()
    with pytest.raises(TooBusy):
        client.get("queue")
    assert time.monotonic() - t0 < 1.0 and len(x.seen) == 1


def keeping(epoch: int) -> Any:
    """A server whose store is away and that keeps the caller's node lease."""
    problem = {"title": "unavailable", "status": 503, "detail": "away", "code": "unavailable",
               "message": "the store does not answer"}  # fmt: skip
    headers = {"X-Gpuledger-Keep": str(epoch), "X-Gpuledger-Store": "away"}
    return lambda *_: (503, headers, json.dumps(problem).encode())


def test_a_frozen_server_costs_its_timeout_once_and_keeps_still_arrive(
    fakes: tuple[Fake, Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """atk36-28 F2: a frozen server is passed over by the next requests of every client sharing
    the agent's `Silent` (each went back to it, its timeout each round), unless a standby names
    it as the leader (then it is the only one that can take the request: atk37-28 F2, and the
    standby names it no longer than its lease); the standby's keep (the store away: it names
    nobody) reaches `on_keep` and the request ends at once with the store's line (the frozen
    one said nothing, as if down), without waiting on it again."""
    import socket

    from ledger.wire.client import Silent
    from schemas.errors import Unavailable

    stand, _ = fakes
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)
    held: list[socket.socket] = []  # accepted, never read: a frozen process

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(frozen.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("GPULEDGER_RETRY_S", "2")
    frozen_url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
    stand.answer = standby(frozen_url)
    silent = Silent(skip_s=60.0)
    keeps: list[int] = []
    first = Client(f"{frozen_url},{stand.url}", "tok", timeout=0.5, silent=silent)
    began = time.monotonic()
    with pytest.raises(Unavailable):
        first.get("jobs")  # frozen (0.5 s each), named by the standby: asked again, till 2 s
    asked = len(held)
    assert asked >= 2 and len(stand.seen) >= 2, (asked, len(stand.seen))
    assert time.monotonic() - began < 4.0 and silent.skipped(frozen_url, time.monotonic())
    stand.answer = keeping(7)
    other = Client(f"{frozen_url},{stand.url}", "tok", timeout=0.5, silent=silent)
    other.on_keep = lambda sent, epoch, granted: keeps.append(epoch)
    began = time.monotonic()
    with pytest.raises(Unavailable, match="store does not answer"):
        other.get("agent/poll")  # begins on the standby: the frozen one is passed over
    assert time.monotonic() - began < 0.4 and keeps == [7] and len(held) == asked
    silent.clear(frozen_url)  # answered (or its pass ran out): asked again
    assert not silent.skipped(frozen_url, time.monotonic())
    frozen.close()
    for conn in held:
        conn.close()
    first.close()
    other.close()


def test_a_slow_leader_the_standby_names_is_asked_again_though_it_let_a_request_time_out(
    fakes: tuple[Fake, Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """atk37-28 F2: a leader that took longer than the client's timeout once (a stall shorter
    than its lease) is the one the standby names: the next try goes back to it and is answered
    (it was passed over for `SILENT_SKIP_S` while the standby named it, and its agents' nodes
    were counted lost)."""
    from ledger.wire.client import Silent

    stand, lead = fakes
    stand.answer = standby(lead.url)
    stalls = [0.8]

    def slow(*_: Any) -> tuple[int, dict[str, str], bytes]:
        if stalls:
            time.sleep(stalls.pop())
        return 200, {}, b"[]"

    lead.answer = slow
    monkeypatch.setenv("GPULEDGER_RETRY_S", "2")
    silent = Silent(skip_s=60.0)
    client = Client(f"{lead.url},{stand.url}", "tok", timeout=0.5, silent=silent)
    assert client.get("jobs") == []  # timed out on the leader, named by the standby, answered
    assert client.url == lead.url and len(lead.seen) == 2 and len(stand.seen) == 1
    client.close()


def test_a_write_forwarded_to_a_leader_that_refuses_the_connection_is_said_not_taken() -> None:
    """atk61-ha F6: a standby forwarding to a killed leader (its port refuses) answered 503
    "outcome unknown", "the leader did not answer ([Errno 111] Connection refused)": a refused
    connect carried nothing, so the write is not taken, and a retry is safe."""
    import asyncio

    gone = refused_url()
    front = _standby_front(gone)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/commands/submit", "query_string": b"",
             "headers": [(b"authorization", b"Bearer x"), (b"content-length", b"2")]}  # fmt: skip
    asyncio.run(front(scope, receive, send))
    assert sent[0]["status"] == 503
    names = [k for k, _ in sent[0]["headers"]]
    assert b"x-gpuledger-outcome" not in names, sent[0]
    message = json.loads(sent[1]["body"])["message"]
    assert "was not sent, so it is not taken" in message, message
