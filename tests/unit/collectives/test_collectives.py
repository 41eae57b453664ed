"""Collectives in virtual time: correctness against numpy, errors, and spine traffic."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from prometheus_client import CollectorRegistry

import collectives.bench.checks  # noqa: F401  (registers the check jobs)
from collectives.bench.nccl import expected, pattern, sizes
from collectives.bench.nccl import params as bench_params
from collectives.comm import ops, ring
from collectives.comm.communicator import Communicator, RankPlace, ring_order
from collectives.comm.links import RdmaRx, RdmaTx
from collectives.comm.metrics import HostCollectiveMetrics
from collectives.comm.placement import hierarchy, plan_of
from collectives.comm.session import CollectiveError
from collectives.comm.store import MemoryStore, StoreServer, StoreTimeout, TcpStore
from collectives.jobs.failures import failures, rank_ranges
from collectives.jobs.job import run_virtual
from collectives.jobs.places import comm_options, host_places, places_for
from collectives.jobs.registry import job
from rocev2_emu.control import auth
from rocev2_emu.experiments.harness import VIRTUAL
from rocev2_emu.fabric.nodes import rank_progress
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import fat_tree, leaf_spine, single_switch
from rocev2_emu.topology.model import Topology
from rocev2_emu.transport.errors import RemoteVerbsError
from rocev2_emu.verbs import Doorbell, RecvWR
from rocev2_emu.verbs import api as verbs_api
from rocev2_emu.wire.roce import rxe_udp_sport
from tests.conftest import assert_png


def fabric(spines: int, leaves: int, per_leaf: int, ranks: int, **edits: Any) -> Topology:
    data = tomllib.loads(leaf_spine(spines, leaves, per_leaf))
    for host in data["host"]:
        host["ranks"] = ranks
    for section, values in edits.items():
        data.setdefault(section, {}).update(values)
    return parse(data, "test.toml")


def simulate(n: int, count: int, op: str) -> list[np.ndarray]:
    """Run the all-reduce schedule by hand, step by step, with no network at all."""
    inputs = [np.arange(count, dtype=np.int64) * (k + 1) + k for k in range(n)]
    work = [x.copy() for x in inputs]
    segs = ring.segments(count, n)
    steps = [ring.all_reduce_steps(segs, r) for r in range(n)]
    for s in range(len(steps[0])):
        sent = [
            work[r][slice(*send)].copy() if (send := steps[r][s].send) else None for r in range(n)
        ]
        for r in range(n):
            step, incoming = steps[r][s], sent[(r - 1) % n]
            assert step.recv is not None and incoming is not None
            lo, hi = step.recv
            assert hi - lo == incoming.size  # the predecessor sends what this rank expects
            if step.reduce:
                ops.combine(op, work[r][lo:hi], incoming)
            else:
                work[r][lo:hi] = incoming
    return [w - ops.reference(op, inputs) for w in work]


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("count", [0, 1, 7, 64])
def test_ring_all_reduce_schedule_is_right_by_hand(n: int, count: int) -> None:
    for op in ("sum", "max"):
        assert all(not d.any() for d in simulate(n, count, op))


def test_segments_split_evenly_and_cover_everything() -> None:
    assert ring.segments(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert ring.segments(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert ring.imm_of(0x1FF, 0x30007) == 0xFF030007


def test_topology_order_is_leaf_major_whatever_the_rank_order() -> None:
    places = [RankPlace(r, f"h{r % 4}", f"leaf{r % 2}", r // 4) for r in range(8)]
    order = ring_order(places, "topology")
    leaves = [places[r].leaf for r in order]
    assert leaves == ["leaf0"] * 4 + ["leaf1"] * 4  # the ring crosses the spine twice
    assert ring_order(places, "rank") == list(range(8))


def test_ops_reference_and_avg_truncates_toward_zero() -> None:
    x = [np.array([-7, 7], np.int32), np.array([0, 0], np.int32)]
    assert ops.reference("avg", x).tolist() == [-3, 3]
    with pytest.raises(ValueError, match="reduction op"):
        ops.check("xor", np.dtype(np.int32))
    with pytest.raises(TypeError, match="dtype"):
        ops.check("sum", np.dtype(np.uint8))


def test_bench_patterns_and_expected_values() -> None:
    assert sizes(8, 64, 2) == [8, 16, 32, 64]
    want = expected("all_reduce", 3, 5, np.dtype(np.float32), "sum", 0, 0)
    assert want.tolist() == [3, 6, 9, 7, 5]  # (rank + i) mod 5 summed over ranks 0-2
    assert set(pattern(1, 20, np.dtype(np.int32), "prod").tolist()) == {1, 2}


def test_a_topology_s_places_are_worked_out_once_and_shared_with_its_plan() -> None:
    one, two = fabric(2, 4, 2, 1), fabric(2, 4, 2, 2)
    first = places_for(one)
    assert places_for(one) is first  # the same list: the job's plan is made once for it
    assert plan_of(first) is plan_of(places_for(one))
    assert host_places(one, "h1") == [p for p in first if p.host == "h1"]
    assert [p.rank for p in places_for(two)] == list(range(16))  # another topology: its own
    assert places_for(one) == first
    plan = plan_of(first)
    members, positions = plan.ring("topology")
    assert [members[positions[r]] for r in range(8)] == list(range(8))
    rings = plan.hierarchy.rank_ring_members(5)
    assert all(members[pos] == 5 for members, pos in rings.values()) and len(rings) == 2


@pytest.mark.slow
def test_every_op_and_dtype_on_16_ranks() -> None:
    topo = fabric(2, 4, 2, 2)  # 8 hosts x 2 ranks; hierarchical runs too
    results, _ = run_virtual(topo, "check", {"sizes": [17]})
    assert len(results) == 16
    assert all(v == [] for v in results.values()), [v for v in results.values() if v][:1]


@pytest.mark.slow
def test_awkward_sizes_on_16_ranks() -> None:
    topo = fabric(2, 4, 2, 2)
    params = {"sizes": [0, 1, 1000], "dtypes": ["float32", "int64"], "ops": ["sum", "avg", "min"]}
    results, _ = run_virtual(topo, "check", params)
    assert all(v == [] for v in results.values()), [v for v in results.values() if v][:1]


def test_all_reduce_on_64_ranks() -> None:
    topo = fabric(2, 4, 4, 4)  # 16 hosts x 4 ranks
    params = {"sizes": [65], "dtypes": ["float32"], "ops": ["sum"], "collectives": ["all_reduce"]}
    results, fabric_ = run_virtual(topo, "check", params)
    assert len(results) == 64 and all(v == [] for v in results.values())
    assert fabric_["switch_tx_bytes"]["spine0"] + fabric_["switch_tx_bytes"]["spine1"] > 0


def test_the_hierarchy_comes_from_the_topology_and_skips_single_member_levels() -> None:
    shipped = hierarchy(places_for(fabric(2, 4, 2, 1)))  # one rank per host, 2 hosts per leaf
    assert shipped.levels == ["rack", "top"]
    assert sorted(shipped.rings["rack"].values()) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(shipped.rings["top"].values()) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    two_per_host = hierarchy(places_for(fabric(2, 4, 2, 2)))
    assert two_per_host.levels == ["server", "rack", "top"]
    assert two_per_host.rings["rack"]["rack:0"] == [0, 2]  # local rank 0 of h0 and of h1
    tree = hierarchy(places_for(parse(tomllib.loads(fat_tree(4)), "ft.toml")))
    assert tree.levels == ["rack", "pod", "top"]  # edges of a pod share their aggregation
    assert tree.rings["pod"]["pod:0"] == [0, 2]  # position 0 under edge0_0 and edge0_1
    assert sorted(tree.rings["top"].values())[0] == [0, 4, 8, 12]  # one per pod
    one_leaf = hierarchy(places_for(fabric(1, 1, 4, 1)))
    assert one_leaf.levels == [] and "no level below the whole job" in str(one_leaf.refused)
    uneven = [RankPlace(r, f"h{r}", "leaf0" if r < 2 else "leaf1", 0) for r in range(5)]
    refused = hierarchy(uneven)
    assert (
        refused.levels == []
        and refused.refused == "its racks hold different numbers of ranks [2, 3]"
    )


@pytest.mark.slow
def test_hierarchical_all_reduce_by_rack_and_pod_on_a_fat_tree() -> None:
    topo = parse(tomllib.loads(fat_tree(4)), "ft.toml")  # 16 hosts, 8 racks, 4 pods
    params = {
        "sizes": [0, 1, 13, 1000],
        "dtypes": ["float16", "float32", "int64"],
        "ops": ["sum", "prod", "max", "avg"],
        "collectives": ["all_reduce"],
    }
    results, _ = run_virtual(topo, "check", params)
    assert len(results) == 16 and all(v == [] for v in results.values()), [
        v for v in results.values() if v
    ][:1]


@job("refused_hierarchy")
async def refused_hierarchy(comm: Communicator, params: dict[str, Any]) -> str:
    try:
        await comm.all_reduce(np.ones(4, np.float32), algo="hierarchical")
    except ValueError as exc:
        return str(exc)
    return "ran"


def test_hierarchical_all_reduce_refuses_racks_of_unequal_size() -> None:
    data = tomllib.loads(leaf_spine(2, 2, 2))
    data["link"] = [lk for lk in data["link"] if "h3" not in (lk["a"], lk["b"])]
    data["host"] = [h for h in data["host"] if h["name"] != "h3"]
    results, _ = run_virtual(parse(data, "uneven.toml"), "refused_hierarchy", {})
    assert set(results.values()) == {
        "no hierarchical all-reduce on this job: its racks hold different numbers of ranks [1, 2]"
    }


@job("links_qps")
async def links_qps(comm: Communicator, params: dict[str, Any]) -> list[list[int]]:
    """The QPNs of each of this rank's RDMA links (after one all-to-all made the pairs)."""
    await comm.all_to_all(np.zeros(comm.size * 4, np.float32))
    return [
        [qp.qp_num for qp in end.qps]
        for r in comm.rings.values()
        for end in (r.tx, r.rx)
        if isinstance(end, RdmaTx | RdmaRx)
    ]


@pytest.mark.slow
def test_qps_per_connection_stripes_every_link_and_every_operation_stays_exact() -> None:
    topo = fabric(2, 4, 2, 2)  # 16 ranks: links in shared memory and over RDMA
    results, _ = run_virtual(topo, "links_qps", {"qps_per_connection": 3})
    for links in results.values():
        assert links and all(len(qpns) == 3 for qpns in links)
        # three flows for ECMP: three UDP source ports, as rxe derives them from the QPN
        assert all(len({rxe_udp_sport(q) for q in qpns}) == 3 for qpns in links)
    params = {
        "sizes": [1, 70000],  # 70000 float32: two chunks of a 256 KiB slot
        "dtypes": ["float32"],
        "ops": ["sum"],
        "qps_per_connection": 3,
    }
    results, _ = run_virtual(topo, "check", params)
    assert all(v == [] for v in results.values()), [v for v in results.values() if v][:1]


@job("grant_qps")
async def grant_qps(comm: Communicator, params: dict[str, Any]) -> list[int | None]:
    """The DSCP of each RDMA link's grant QP, after an all-reduce."""
    await comm.all_reduce(np.ones(4096, np.float32))
    return [
        end.grant_qp.qp.traffic_class if end.grant_qp else None
        for r in comm.rings.values()
        for end in (r.tx, r.rx)
        if isinstance(end, RdmaTx | RdmaRx)
    ]


def test_receiver_grants_on_their_own_high_priority_qp_keep_every_operation_exact() -> None:
    topo = fabric(2, 4, 2, 1)
    results, _ = run_virtual(topo, "grant_qps", {"grant_dscp": 48})
    assert all(dscps and set(dscps) == {48} for dscps in results.values()), results
    params = {
        "sizes": [1, 70000],
        "dtypes": ["float32"],
        "ops": ["sum"],
        "grant_dscp": 48,
        "slots": 2,  # a window of two chunks per link
        "qps_per_connection": 2,
    }
    results, _ = run_virtual(topo, "check", params)
    assert all(v == [] for v in results.values()), [v for v in results.values() if v][:1]
    with pytest.raises(ValueError, match="grant_dscp 99"):
        comm_options(topo, {"grant_dscp": 99})


@pytest.mark.slow
def test_all_to_all_v_and_point_to_point_on_64_ranks() -> None:
    topo = fabric(2, 4, 4, 4)  # 16 hosts x 4 ranks: pairs in shared memory and across spines
    params = {"sizes": [3], "dtypes": ["int32"], "collectives": ["p2p"], "slot_bytes": 4096}
    results, fabric_ = run_virtual(topo, "check", params)
    assert len(results) == 64 and all(v == [] for v in results.values()), [
        v for v in results.values() if v
    ][:1]
    assert fabric_["switch_tx_bytes"]["spine0"] + fabric_["switch_tx_bytes"]["spine1"] > 0


@job("p2p_misuse")
async def p2p_misuse(comm: Communicator, params: dict[str, Any]) -> list[str]:
    """What a careless caller gets: a clear error at once, and (for a size the peer does not
    expect) a CollectiveError on the rank that sees it."""
    said = []
    for call in (
        lambda: comm.all_to_all(np.zeros(comm.size + 1, np.float32)),
        lambda: comm.all_to_all_v(np.zeros(4, np.float32), [1] * comm.size, [-1] * comm.size),
        lambda: comm.all_to_all_v(np.zeros(3, np.float32), [2] * comm.size, [2] * comm.size),
        lambda: comm.send(np.zeros(4, np.float32), comm.rank),
        lambda: comm.recv(np.zeros(4, np.float32), comm.size),
    ):
        try:
            await call()
        except ValueError as exc:
            said.append(str(exc))
    try:  # rank 0 sends 8 elements, rank 1 expects 4
        if comm.rank == 0:
            await comm.send(np.zeros(8, np.float32), 1)
        elif comm.rank == 1:
            await comm.recv(np.zeros(4, np.float32), 0)
    except CollectiveError as exc:
        said.append(f"CollectiveError: {exc}")
    return said


def test_point_to_point_misuse_is_a_clear_error() -> None:
    results, _ = run_virtual(fabric(1, 2, 1, 1), "p2p_misuse", {"timeout": 0.001})
    for rank in (0, 1):
        said = results[rank]
        assert len(said) == 5 + (rank == 1), said
        assert "12 elements do not split into 2 equal blocks" not in said[0]
        assert "3 elements do not split into 2 equal blocks" in said[0]
        assert "recv counts [-1, -1] are not 2 counts >= 0" in said[1]
        assert "send counts add up to 4, x has 3" in said[2]
        assert "cannot send to or receive from itself" in said[3]
        assert "peer 2 is no rank of 0..1" in said[4]
    assert results[1][-1].startswith("CollectiveError: rank 1: recv #1 failed: expected step 0")
    # the sender's one small write completes before the receiver's abort reaches it through the
    # store (which takes emulated time, as a real rendezvous does): only the receiver raises


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_a_rank_that_stops_makes_every_other_rank_raise_in_bounded_time(op: str) -> None:
    topo = fabric(2, 4, 2, 2)
    results, _ = run_virtual(topo, "stop", {"rank": 5, "at": 2, "timeout": 0.02, "op": op})
    assert results[5] == "stopped"
    for rank, outcome in results.items():
        if rank == 5:
            continue
        assert outcome.startswith("CollectiveError"), outcome
        assert f"{op} #4" in outcome  # the operation and its sequence number
        ms = float(outcome.split(" at ")[1].split(" ms")[0])
        assert ms < 25.0  # the deadline (20 ms) plus a little: no hang
    # the neighbours name the rank that went away
    assert "from rank 5" in results[6] or "rank 5" in results[4]


def test_an_error_handling_a_completion_fails_the_ranks_links_not_the_fabric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Completions are dispatched inside the NIC's driver (the engine, in virtual time): a link
    whose handling raises must fail its rank's operation with the reason, not the engine.  The
    handling that raises here is a link's re-post of the receive a completion consumed (the
    links are compiled: the verbs API's doorbell they post through is where a test can break
    them)."""

    class Broken(Doorbell):
        def post_recv(self, wr: RecvWR) -> None:  # one at a time: a completion's re-post
            raise RuntimeError("boom")

    monkeypatch.setattr(verbs_api, "Doorbell", Broken)  # what QP() builds its doorbell from
    results, _ = run_virtual(fabric(2, 2, 1, 1), "stop", {"rank": -1, "at": 1, "timeout": 0.02})
    assert len(results) == 2
    for outcome in results.values():
        assert outcome.startswith("CollectiveError"), outcome
        assert "handling a completion of rank" in outcome and "boom" in outcome, outcome


def interleaved(ranks: int) -> Topology:
    """Two leaves whose hosts the file lists alternately: rank order crosses the spine at
    every hop, a topology-aware ring only twice."""
    data = tomllib.loads(leaf_spine(2, 2, 2))  # h0, h1 under leaf0; h2, h3 under leaf1
    data["host"] = [{"name": h, "ranks": ranks} for h in ("h0", "h2", "h1", "h3")]
    return parse(data, "interleaved.toml")


def spine_bytes(topo: Topology, algo: str, order: str) -> int:
    results, fab = run_virtual(topo, "bench", bench_params([1 << 20], algo=algo, order=order))
    assert all(row["outofplace"]["wrong"] == 0 for rows in results.values() for row in rows)
    return int(sum(v for k, v in fab["switch_tx_bytes"].items() if k.startswith("spine")))


def test_topology_aware_and_hierarchical_cross_the_spine_less_than_a_naive_ring() -> None:
    topo = interleaved(2)
    assert [p.host for p in places_for(topo)][:4] == ["h0", "h0", "h2", "h2"]
    naive = spine_bytes(topo, "ring", "rank")
    aware = spine_bytes(topo, "ring", "topology")
    hier = spine_bytes(topo, "hierarchical", "topology")
    assert aware < naive / 1.5
    assert hier < naive / 1.5


async def test_tcp_store_set_get_add_and_deadlines(fabric_secret: bytes) -> None:
    server = StoreServer("127.0.0.1", 0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        a = await TcpStore.connect("127.0.0.1", port)
        b = await TcpStore.connect("127.0.0.1", port)

        async def late_set() -> None:
            await trio.sleep(0.05)
            await a.set("k", {"qpn": 7})

        nursery.start_soon(late_set)
        assert await b.get("k", 5.0) == {"qpn": 7}  # waits for the key
        assert await b.take("k", 5.0) == {"qpn": 7}  # and takes it away
        with pytest.raises(StoreTimeout, match="'k'"):
            await b.get("k", 0.05)
        assert await a.add("n", 2) == 2 and await b.add("n", 3) == 5
        with pytest.raises(StoreTimeout, match="'missing'"):
            await b.get("missing", 0.05)
        await a.aclose()
        await b.aclose()
        auth.use(auth.new())  # a rank of another fabric is refused, and told why
        with pytest.raises(RemoteVerbsError, match=r"refused this client.*authentication failed"):
            await TcpStore.connect("127.0.0.1", port)
        nursery.cancel_scope.cancel()


async def test_memory_store_waits_with_a_deadline() -> None:
    store = MemoryStore()
    with pytest.raises(StoreTimeout):
        await store.get("x", 0.01)
    await store.set("x", 1)
    assert await store.get("x", 0.01) == 1
    assert await store.take("x", 0.01) == 1
    assert "x" not in store.data
    with pytest.raises(StoreTimeout):
        await store.take("x", 0.01)


def test_rank_metrics_count_operations_bytes_and_bandwidth() -> None:
    registry = CollectorRegistry()
    families = HostCollectiveMetrics(registry)
    topo = fabric(1, 2, 1, 1)  # two hosts, one rank each
    job = bench_params([4096], iters=3, warmup=1, algo="ring")
    run_virtual(topo, "bench", job, metrics=families)
    labels = {"rank": "1", "op": "all_reduce"}
    ops_done = registry.get_sample_value("rocev2_collective_operation_seconds_count", labels)
    assert ops_done == 2 * (3 + 1)  # out-of-place and in-place, warm-up included
    assert registry.get_sample_value("rocev2_collective_operations_total", labels) == ops_done
    assert rank_progress(registry)["1"]["ops"] == ops_done  # what the map shows of rank 1
    assert registry.get_sample_value("rocev2_collective_bytes_total", labels) == ops_done * 4096
    latency = registry.get_sample_value("rocev2_collective_operation_seconds_sum", labels)
    assert latency is not None and 0 < latency / ops_done < 1e-3  # emulated microseconds
    algbw = registry.get_sample_value("rocev2_collective_algbw_bytes_per_second", labels)
    busbw = registry.get_sample_value("rocev2_collective_busbw_bytes_per_second", labels)
    assert algbw is not None and busbw == pytest.approx(algbw * 2 * (2 - 1) / 2)


# three 40-iteration virtual runs of a 22-node fabric: about 115 s on an idle core here, so
# well past the default per-test timeout on a busy machine (a hang still ends the test)
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_straggler_bursts_stretch_the_tail_and_dcqcn_shrinks_it(tmp_path: Path) -> None:
    from collectives.plugin import register
    from rocev2_emu.experiments import harness

    register()  # what the CLI does through the rocev2_emu.plugins entry point
    assert harness.main("straggler", seed=1, out=str(tmp_path), options=VIRTUAL) == 0
    assert_png(tmp_path / "straggler.png")
    data = json.loads((tmp_path / "straggler.json").read_text())
    quiet, pfc, both = data["runs"]
    assert len(quiet["times"]) == 40 and pfc["fabric"]["pfc_tx"] > 0
    assert pfc["p99"] > 1.25 * quiet["p99"]
    assert both["tail"] < pfc["tail"] and both["lost"] < pfc["lost"]
    assert both["fabric"]["pfc_tx"] < pfc["fabric"]["pfc_tx"]  # DCQCN: fewer pauses


def test_straggler_topology_keeps_the_leaf_spine_and_scales_to_a_fat_tree() -> None:
    from collectives.scenarios.straggler import straggler_topology

    def placed(topo: Topology) -> dict[str, str]:
        return {h.name: topo.host_link(h.name)[1].name for h in topo.hosts if h.ranks == 0}

    small = straggler_topology(1, dcqcn=False)
    assert placed(small) == {
        "bgr": "leaf0",
        **{f"bg{leaf}{k}": f"leaf{leaf}" for leaf in (1, 2, 3) for k in (0, 1)},
    }
    big = straggler_topology(1, dcqcn=True, base=fat_tree(4))
    assert sum(h.ranks for h in big.hosts) == 16  # every host of the file is a rank
    last_three = ["edge2_1", "edge3_0", "edge3_1"]  # of the eight edges, in host order
    assert placed(big) == {
        "bgr": "edge0_0",
        **{f"bg{j}{k}": edge for j, edge in enumerate(last_three, 1) for k in (0, 1)},
    }
    switches = {s.name for s in big.switches}
    uplinks = [lk for lk in big.links if lk.a in switches and lk.b in switches]
    assert len(uplinks) == 32 and all(lk.rate_bps == 400e9 for lk in uplinks)
    with pytest.raises(ValueError, match="the bursts need 4"):
        straggler_topology(1, dcqcn=False, base=leaf_spine(1, 2, 2))


# three 4-iteration virtual runs of a k = 4 fat-tree (16 ranks, 27 nodes): ~10 s here
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_straggler_at_scale_takes_a_topology_iterations_and_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from collectives.plugin import register
    from rocev2_emu.experiments import harness

    register()
    (tmp_path / "ft4.toml").write_text(fat_tree(4))
    scale: dict[str, Any] = {"topology": str(tmp_path / "ft4.toml"), "iterations": 4}
    harness.main("straggler", seed=1, out=str(tmp_path), options=VIRTUAL, scale=scale)
    quiet, pfc, both = json.loads((tmp_path / "straggler.json").read_text())["runs"]
    assert [r["ranks"] for r in (quiet, pfc, both)] == [16, 16, 16]
    assert quiet["bytes"] == 256 << 10 and len(quiet["times"]) == 4
    assert pfc["fabric"]["pfc_tx"] > 0 and pfc["p99"] > 1.25 * quiet["p99"]
    assert "edge0_0" in pfc["fabric"]["pfc_senders"]  # the receiver's edge pauses its uplinks
    capsys.readouterr()
    assert harness.main("straggler", seed=1, out=None, options=VIRTUAL, scale={"senders": 3}) == 2
    assert "scenario straggler takes no --senders" in capsys.readouterr().err


def test_straggler_runs_a_flat_ring_up_to_128_ranks_and_the_tuned_schedule_above() -> None:
    from collectives.scenarios.straggler import FLAT_RING_RANKS, schedule

    assert FLAT_RING_RANKS == 128
    assert [schedule(n) for n in (8, 128, 129, 1024)] == ["ring", "ring", "auto", "auto"]


# three 2-iteration virtual runs of a k = 4 fat-tree with the flat ring's limit lowered to 8
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_straggler_above_the_flat_ring_limit_says_it_runs_the_tuned_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from collectives.plugin import register
    from collectives.scenarios import straggler
    from rocev2_emu.experiments import harness

    register()
    (tmp_path / "ft4.toml").write_text(fat_tree(4))
    scale: dict[str, Any] = {"topology": str(tmp_path / "ft4.toml"), "iterations": 2}
    monkeypatch.setattr(straggler, "FLAT_RING_RANKS", 8)
    harness.main("straggler", seed=1, out=str(tmp_path / "auto"), options=VIRTUAL, scale=scale)
    assert "all-reduce schedule: auto (more than 8 ranks)" in capsys.readouterr().out
    monkeypatch.setattr(straggler, "FLAT_RING_RANKS", 128)
    harness.main("straggler", seed=1, out=str(tmp_path / "ring"), options=VIRTUAL, scale=scale)
    assert "all-reduce schedule" not in capsys.readouterr().out
    tuned, ring = (
        json.loads((tmp_path / d / "straggler.json").read_text())["runs"][0]["times"]
        for d in ("auto", "ring")
    )
    assert tuned != ring  # a different schedule ran


# ten virtual runs of a 40-node fabric, at a quarter of the shipped size (a 2 MiB ring over 32
# ranks, a 256 KiB all-to-all): about half a minute here; a hang still ends the test
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ecmp_entropy_collisions_show_with_one_qp_and_qp_scaling_spreads_them(
    tmp_path: Path,
) -> None:
    from collectives.plugin import register
    from rocev2_emu.experiments import harness

    register()
    scale = {"size": 2 << 20}
    assert (
        harness.main("ecmp-entropy", seed=1, out=str(tmp_path), options=VIRTUAL, scale=scale) == 0
    )
    assert_png(tmp_path / "ecmp-entropy.png")
    rows = json.loads((tmp_path / "ecmp-entropy.json").read_text())["runs"]
    by = {(r["workload"], r["setting"]): r for r in rows}
    assert len(rows) == 10 and all(r["wrong"] == 0 for r in rows)
    one, spread = by["all-reduce", "5-tuple, 1 QP"], by["all-reduce", "QPN hashing, 8 QPs"]
    assert one["imbalance"] >= 1.3 and spread["imbalance"] < one["imbalance"]
    assert spread["busbw"] > one["busbw"]
    # every spine link is counted once per direction: 4 leaves x 4 spines x 2
    assert all(len(r["spine_loads"]) == 32 for r in rows)


def test_a_link_reports_its_first_error_not_the_flush_after_it() -> None:
    from collectives.comm.links import LocalRx
    from rocev2_emu.server.crossbar import PRESETS
    from rocev2_emu.server.fabric import ServerFabric

    rx = LocalRx(2, 64, ServerFabric(PRESETS["free"], 2), 0, 1)
    rx.fail("link with rank 3: RDMA_WRITE completed with RETRY_EXC_ERR")
    rx.fail("link with rank 3: RECV completed with WR_FLUSH_ERR")
    assert rx.error == "link with rank 3: RDMA_WRITE completed with RETRY_EXC_ERR"


# eight virtual runs of a 40-node fabric, each workload twice (shipped: 4 and 12 times)
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_admission_bounds_the_window_and_loses_nothing(tmp_path: Path) -> None:
    from collectives.plugin import register
    from rocev2_emu.experiments import harness

    register()
    scale = {"iterations": 2}
    assert harness.main("admission", seed=1, out=str(tmp_path), options=VIRTUAL, scale=scale) == 0
    assert_png(tmp_path / "admission.png")
    rows = json.loads((tmp_path / "admission.json").read_text())["runs"]
    by = {(r["workload"], r["setting"]): r for r in rows}
    assert len(rows) == 8 and all(r["wrong"] == 0 and r["drops"] == 0 for r in rows)
    assert all(r["over_window"] == 0 and r["links"] > 0 for r in rows)
    pfc, window = by["incast 8:1", "PFC only"], by["incast 8:1", "PFC + admission"]
    # the incast congests (PFC pauses), and the 2-slot window is used to its limit, not past it
    assert pfc["pfc_tx"] > 0 and window["in_flight"] == window["window"] == 2


# four virtual runs of 41- and 44-node fabrics, six 256 KiB all-reduces each (shipped: 4 MiB)
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_spine_failure_loses_no_byte_and_costs_busbw_while_spines_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from collectives.plugin import register
    from rocev2_emu.experiments import harness

    register()
    scale = {"size": 256 << 10}
    assert (
        harness.main("spine-failure", seed=1, out=str(tmp_path), options=VIRTUAL, scale=scale) == 0
    )
    assert_png(tmp_path / "spine-failure.png")
    spare, tight = json.loads((tmp_path / "spine-failure.json").read_text())["runs"]
    assert spare["spines"] == 9 and tight["spines"] == 8
    for r in (spare, tight):
        assert r["wrong"] == 0 and r["link_down_drops"] > 0 and r["retransmitted"] > 0
        assert len(r["busbw"]) == 6 and r["during"] < r["quiet_during"]
    # the comparison of the two fabrics is reported (inside ECMP's spread over seeds)
    out = capsys.readouterr().out
    assert "# spare spines: busbw after the failure" in out and "reported, not checked" in out
    assert out.count(": pass") == 3 and "FAIL" not in out


def test_a_jobs_failures_are_said_once_per_reason_with_the_ranks_as_ranges() -> None:
    bad: dict[int, Any] = {r: {"error": "ValueError: too long"} for r in range(1024)}
    bad[2000] = {"error": "LinkError: gone"}
    bad[2001] = [1, 2]  # what a rank returned instead of a result
    assert failures(bad) == [
        "ranks 0-1023: ValueError: too long",
        "rank 2000: LinkError: gone",
        "rank 2001: [1, 2]",
    ]
    assert rank_ranges([8, 0, 1, 2, 5, 7]) == "0-2, 5, 7-8"


def test_a_flat_ring_of_more_than_128_ranks_runs() -> None:
    """130 ranks: 258 steps, past the 255 that 8 bits of step in the immediate allowed."""
    topo = parse(tomllib.loads(single_switch(130)), "ss130.toml")
    p = bench_params([4096], algo="ring", iters=1, warmup=0)
    results, _ = run_virtual(topo, "bench", p)
    assert len(results) == 130
    assert all(
        r[0]["outofplace"]["wrong"] == 0 == r[0]["inplace"]["wrong"] for r in results.values()
    )
