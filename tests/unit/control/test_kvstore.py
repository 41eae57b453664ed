"""The rendezvous store as a node of the emulation (rocev2_emu/control/kvstore.py) and its
clients in virtual time (rocev2_emu/fabric/rendezvous.py): operations take the store's latency
each way, apply in (arrival, host, sequence) order whatever order they were handed over in, and
a barrier's arrivals all leave at once."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from rocev2_emu.control import kvstore
from rocev2_emu.control.kvstore import STORE_LATENCY, StoreCore, StoreOp
from rocev2_emu.fabric.rendezvous import StoreTimeout, VirtualStore
from rocev2_emu.runtime.clock import DilatedClock
from rocev2_emu.runtime.engine import Engine

D = STORE_LATENCY


def test_operations_apply_in_arrival_host_sequence_order_not_submission_order() -> None:
    core = StoreCore()
    ops = [
        StoreOp(1.0, 2, 1, "set", "k", "from host 2"),
        StoreOp(1.0, 1, 1, "set", "k", "from host 1"),
        StoreOp(0.5, 3, 7, "get", "k"),
        StoreOp(1.0, 1, 2, "get", "k"),
    ]
    for op in ops:
        core.submit(op)
    assert core.next_time() == 0.5
    replies = core.run_until(math.inf)
    # the early get waits for the first set (host 1's): it and the set are answered D later
    got = {(r.origin, r.seq): (r.at, r.value) for r in replies}
    assert got[3, 7] == (1.0 + D, "from host 1")
    assert got[1, 2] == (1.0 + D, "from host 1")  # host 1's get comes before host 2's set
    assert core.data["k"] == "from host 2"  # which is applied last


def test_a_window_applies_only_what_arrived_before_its_end() -> None:
    core = StoreCore()
    core.submit(StoreOp(2.0, 0, 1, "add", "n", 5))
    core.submit(StoreOp(1.0, 0, 2, "add", "n", 1))
    assert [r.value for r in core.run_until(2.0)] == [1]
    assert [r.value for r in core.run_until(2.0 + 1e-9)] == [6]


def test_a_barrier_answers_every_arrival_when_the_last_comes() -> None:
    core = StoreCore()
    for host, at in enumerate([3.0, 1.0, 2.0]):
        core.submit(StoreOp(at, host, 1, "arrive", "b", 3))
    replies = core.run_until(math.inf)
    assert sorted(r.origin for r in replies) == [0, 1, 2]
    assert {r.at for r in replies} == {3.0 + D}


def test_a_take_answers_as_a_get_and_the_key_is_gone() -> None:
    core = StoreCore()
    core.submit(StoreOp(1.0, 0, 1, "set", "qp", [7]))
    core.submit(StoreOp(2.0, 1, 1, "take", "qp"))
    core.submit(StoreOp(3.0, 2, 1, "get", "qp"))  # after the take: waits for the next set
    replies = core.run_until(math.inf)
    assert [(r.origin, r.at, r.value) for r in replies] == [(0, 1.0 + D, True), (1, 2.0 + D, [7])]
    assert "qp" not in core.data


def test_a_set_answers_the_waiting_gets_and_the_first_take_the_rest_wait() -> None:
    core = StoreCore()
    core.submit(StoreOp(1.0, 0, 1, "get", "k"))
    core.submit(StoreOp(1.0, 1, 1, "take", "k"))
    core.submit(StoreOp(1.0, 2, 1, "take", "k"))
    core.submit(StoreOp(2.0, 3, 1, "set", "k", "a"))
    first = core.run_until(3.0)
    assert sorted((r.origin, r.value) for r in first if r.origin != 3) == [(0, "a"), (1, "a")]
    assert "k" not in core.data  # host 1 took it; host 2 still waits
    core.submit(StoreOp(4.0, 3, 2, "set", "k", "b"))
    second = core.run_until(math.inf)
    assert [(r.origin, r.value) for r in second if r.origin != 3] == [(2, "b")]
    assert "k" not in core.data


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ([0.0, 0, 1, "drop", "k", None], "store operation"),
        ([math.inf, 0, 1, "get", "k", None], "time"),
        ([0.0, 0, 1, "add", "k", "one"], "amount"),
        ([0.0, 0, 1, "get", "", None], "key"),
        ("set k", "a store operation is"),
    ],
)
def test_a_malformed_operation_from_a_process_is_an_error(item: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StoreOp.from_wire(item)


def test_a_full_store_refuses_a_new_key_until_a_take_frees_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kvstore, "MAX_KEYS", 2)
    core = StoreCore()
    for seq, key in enumerate(["a", "b", "c"], 1):
        core.submit(StoreOp(float(seq), 0, seq, "set", key, seq))
    core.submit(StoreOp(4.0, 1, 1, "take", "a"))
    core.submit(StoreOp(5.0, 0, 4, "set", "c", 3))
    errors = [r.error for r in core.run_until(math.inf) if r.origin == 0]
    assert errors[:2] == [None, None] and "holds 2 keys" in str(errors[2])
    assert errors[3] is None and sorted(core.data) == ["b", "c"]


def test_a_counter_that_would_overflow_is_refused() -> None:
    core = StoreCore()
    core.submit(StoreOp(1.0, 0, 1, "add", "n", (1 << 63) - 1))
    core.submit(StoreOp(1.0, 0, 2, "add", "n", 1))
    replies = core.run_until(math.inf)
    assert replies[1].error is not None and "int64" in replies[1].error


@pytest.mark.parametrize("on_engine", [False, True], ids=["task", "engine"])
def test_in_virtual_time_each_operation_takes_the_latency_both_ways(on_engine: bool) -> None:
    """The same instants from the store's own trio task and from an alarm on an engine's heap
    (the virtual fabric's store)."""
    seen: dict[str, float] = {}

    async def main() -> None:
        clock = DilatedClock(1.0)
        engine = Engine() if on_engine else None
        store = VirtualStore(clock, engine)
        assert store.on_engine is on_engine
        a, b = store.client(0, clock), store.client(1, clock)
        async with trio.open_nursery() as nursery:
            if engine is not None:
                await nursery.start(engine.run)
            else:
                nursery.start_soon(store.run)

            async def waiter() -> None:
                seen["value"] = await b.get("k", timeout=1.0)
                seen["got"] = clock.now()

            nursery.start_soon(waiter)
            await trio.sleep(10e-6)
            await a.set("k", 42)
            seen["set"] = clock.now()
            with pytest.raises(StoreTimeout, match="'never'"):
                await b.get("never", timeout=5e-6)
            seen["timed out"] = clock.now()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen["value"] == 42
    assert seen["set"] == pytest.approx(10e-6 + 2 * D)
    assert seen["got"] == pytest.approx(10e-6 + 2 * D)  # applied at 10 us + D, back D later
    assert seen["timed out"] == pytest.approx(10e-6 + 2 * D + 5e-6)


def test_an_answer_that_never_comes_ends_the_operation_after_the_deadline() -> None:
    """A set whose answer is lost (an exact run's reply sent to the wrong rank, once) stops the
    rank after ANSWER_DEADLINE emulated seconds, naming the operation, instead of idling
    through emulated time for ever."""
    from rocev2_emu.fabric.rendezvous import ANSWER_DEADLINE, EmulatedStore
    from rocev2_emu.runtime.replies import StoreWaiter

    sent: list[StoreOp] = []

    def lost(op: StoreOp) -> StoreWaiter:
        sent.append(op)
        return StoreWaiter()  # nobody will deliver to it

    seen: dict[str, float] = {}

    async def main() -> None:
        clock = DilatedClock(1.0)
        client = EmulatedStore(3, clock, lost)
        with pytest.raises(StoreTimeout, match="no answer to set 'job/rank3'"):
            await client.set("job/rank3", "here")
        seen["at"] = clock.now()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [(op.origin, op.op, op.key) for op in sent] == [(3, "set", "job/rank3")]
    assert seen["at"] == pytest.approx(ANSWER_DEADLINE)
