"""The compose testbed's files: generated, checked in, consistent, and free of placeholders."""

from __future__ import annotations

import json
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest

from collectives import launcher
from rocev2_emu.control import auth
from rocev2_emu.testbed import dashboards
from rocev2_emu.testbed.compose import BRIDGE_MTU, SYNC_PORT, TRAIN_SYNC_PORT, generate
from rocev2_emu.topology import generate as topogen
from rocev2_emu.topology.file import load, parse
from rocev2_emu.topology.model import TopologyError
from rocev2_emu.topology.processes import process_groups

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = "examples/topologies/leaf-spine.toml"


def test_checked_in_testbed_is_the_generators_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the files name the topology by this relative path
    written = generate(SHIPPED, str(tmp_path))
    assert len(written) == 16
    for path in written:
        if path.name == "fabric.secret":
            continue  # made per testbed, never checked in
        rel = path.relative_to(tmp_path)
        assert (ROOT / rel).read_text() == path.read_text(), (
            f"{rel} drifted: rocev2-emu compose {SHIPPED}"
        )


def test_compose_file_runs_every_node_on_the_exact_clock_joining_the_jobs_coordinator() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "\nversion:" not in text and not text.startswith("version:")  # v1 and v2 alike
    topo = load(ROOT / "deploy" / "topology.toml")
    job = text.split("\n  job:\n")[1].split("\n  prometheus:\n")[0]
    job_ip = re.search(r"ipv4_address: (\S+)", job)
    assert job_ip is not None
    sync = f"{job_ip.group(1)}:{SYNC_PORT}"
    for node in topo.nodes.values():
        block = re.search(rf"\n  {node.name}:\n((?:    .*\n)*)", text)
        assert block is not None, node.name
        assert f"ipv4_address: {node.address}" in block.group(1)
        assert node.address.startswith("172.30.0.")
        assert f'"--clock", "exact", "--sync", "{sync}", "--join-timeout"' in block.group(1)
    # the job serves the coordinator the nodes join: it waits for them to start, not to be
    # healthy (a node serves only once it has joined)
    assert f'"--attach", "--clock", "exact", "--sync", "{sync}"' in job
    assert job.count("condition: service_started") == len(topo.nodes)
    assert "service_healthy" not in job
    prom = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert all(f'"{n.address}:9100"' in prom for n in topo.nodes.values())


def test_wall_compose_file_keeps_a_fabric_up_and_waits_for_health() -> None:
    text = (ROOT / "docker-compose.wall.yml").read_text()
    assert "\nversion:" not in text and not text.startswith("version:")
    topo = load(ROOT / "deploy" / "topology.toml")
    for node in topo.nodes.values():
        assert f"\n  {node.name}:\n" in text
        assert f"ipv4_address: {node.address}" in text
    assert "exact" not in text.split("\nservices:\n")[1]
    job = text.split("\n  job:\n")[1].split("\n  prometheus:\n")[0]
    assert job.count("condition: service_healthy") == len(topo.nodes)
    assert '"--attach"' in job


def test_training_file_runs_every_rank_and_switch_on_the_exact_clock_of_the_first_host() -> None:
    text = (ROOT / "docker-compose.training.yml").read_text()
    assert "\nversion:" not in text and not text.startswith("version:")
    topo = load(ROOT / "deploy" / "topology.toml")
    assert TRAIN_SYNC_PORT == launcher.SYNC_PORT  # where launch --host serves the coordinator
    sync = f"{topo.hosts[0].address}:{TRAIN_SYNC_PORT}"
    for node in topo.nodes.values():
        block = re.search(rf"\n  {node.name}:\n((?:    .*\n)*)", text)
        assert block is not None, node.name
        body = block.group(1)
        assert f"ipv4_address: {node.address}" in body
        if node.name in {h.name for h in topo.hosts}:
            assert f'"--host", "{node.name}", "--clock", "exact"' in body
            # a switch serves only once it has joined, so a rank waits for it started
            assert body.count("condition: service_started") == len(topo.nodes) - len(topo.hosts)
            assert "service_healthy" not in body
        else:
            assert f'"--clock", "exact", "--sync", "{sync}", "--join-timeout"' in body


def test_swarm_stack_runs_on_the_exact_clock_of_its_job() -> None:
    text = (ROOT / "deploy" / "docker-stack.yml").read_text()
    topo = load(ROOT / "deploy" / "topology.toml")
    for name in topo.nodes:
        block = re.search(rf"\n  {name}:\n((?:    .*\n)*)", text)
        assert block is not None, name
        assert f'"--clock", "exact", "--sync", "job:{SYNC_PORT}"' in block.group(1), name
    job = text.split("\n  job:\n")[1]
    assert f'"--attach", "--clock", "exact", "--sync", "0.0.0.0:{SYNC_PORT}"' in job


def test_a_swarm_stack_of_workers_groups_the_nodes_as_workers_does(tmp_path: Path) -> None:
    """``compose --workers 3`` on a k = 4 fat-tree of 2-accelerator servers (which a container
    per node refuses: a server's hosts share one): only the stack and its topology, a worker
    service per process of ``--workers 3``, each answering to its nodes' names and running
    them, the job told the same grouping."""
    fat_tree = tmp_path / "ft4.toml"
    fat_tree.write_text(topogen.fat_tree(4, servers=topogen.Servers(ranks=2, nics=True)))
    written = generate(str(fat_tree), str(tmp_path / "out"), workers=3)
    assert sorted(p.name for p in written) == [
        "docker-stack.yml",
        "fabric.secret",
        "topology-swarm.toml",
    ]
    text = (tmp_path / "out" / "deploy" / "docker-stack.yml").read_text()
    stack = yaml_services(text)
    topo = load(fat_tree)
    groups = process_groups(topo, 3)
    assert len(groups) == 3 and sorted(stack) == ["job", "worker0", "worker1", "worker2"]
    for i, group in enumerate(groups):
        worker = stack[f"worker{i}"]
        assert worker["aliases"] == group
        assert f'"{",".join(group)}", "--clock", "exact", "--workers", "3"' in worker["text"]
    assert '"--sync", "0.0.0.0:7470", "--workers", "3"' in stack["job"]["text"]
    swarm = tomllib.loads((tmp_path / "out" / "deploy" / "topology-swarm.toml").read_text())
    assert swarm["fabric"]["subnet"] == "dns"


def yaml_services(text: str) -> dict[str, dict[str, Any]]:
    """Each service of a stack file: its text and its network aliases."""
    services: dict[str, dict[str, Any]] = {}
    body = text.split("\nservices:\n")[1].split("\nconfigs:\n")[0]
    for block in re.split(r"\n(?=  \w)", body):
        name = block.split(":")[0].strip()
        aliases = re.findall(r"^          - (\S+)$", block, re.M)
        services[name] = {"text": block, "aliases": aliases}
    return services


def test_every_container_gets_the_fabric_secret_from_a_private_file_kept_across_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    generate(SHIPPED, str(tmp_path))
    secret_file = tmp_path / "deploy" / "fabric.secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = auth.read(secret_file)
    generate(SHIPPED, str(tmp_path))  # the files again: a running testbed keeps its secret
    assert auth.read(secret_file) == secret
    assert secret.hex() not in (tmp_path / "docker-compose.yml").read_text()
    # the host's commands find it beside the testbed's topology
    monkeypatch.delenv(auth.ENV, raising=False)
    monkeypatch.delenv(auth.ENV_FILE, raising=False)
    assert auth.load(str(tmp_path / "deploy" / "topology.toml")) == secret
    topo = load(ROOT / "deploy" / "topology.toml")
    # the stack file (swarm) reads the file as its env_file; the compose files read a copy
    # the secret service makes, and wait for it
    stack = (ROOT / "deploy" / "docker-stack.yml").read_text()
    for service in [*topo.nodes, "job"]:
        block = re.search(rf"\n  {service}:\n((?:    .*\n)*)", stack)
        assert block is not None, service
        assert f"    env_file: ./{auth.BESIDE_TOPOLOGY}\n" in block.group(1), service
    for name, services in (
        ("docker-compose.yml", [*topo.nodes, "job"]),
        ("docker-compose.wall.yml", [*topo.nodes, "job"]),
        ("docker-compose.training.yml", list(topo.nodes)),
    ):
        text = (ROOT / name).read_text()
        assert "env_file" not in text, name  # a fresh clone has no secret file to read
        maker = re.search(r"\n  secret:\n((?:    .*\n)*)", text)
        assert maker is not None, name
        assert "    user: root\n" in maker.group(1)
        assert '"secret", "/deploy/fabric.secret", "--share"' in maker.group(1)
        assert "      - ./deploy:/deploy\n" in maker.group(1)
        for service in services:
            block = re.search(rf"\n  {service}:\n((?:    .*\n)*)", text)
            assert block is not None, (name, service)
            body = block.group(1)
            assert f"      - {auth.ENV_FILE}=/run/rocev2-emu/fabric.secret\n" in body
            assert "      - secret:/run/rocev2-emu:ro\n" in body, (name, service)
            assert (
                "    depends_on:\n      secret:\n        condition: service_completed_successfully"
                in body
            ), (name, service)
        assert text.endswith("volumes:\n  secret: {}\n"), name


def test_dashboards_name_the_fixed_datasource_and_set_units() -> None:
    for name in ("fabric", "transport", "collectives"):
        text = (ROOT / "deploy" / "grafana" / "dashboards" / f"{name}.json").read_text()
        assert "${DS_" not in text
        board = json.loads(text)
        assert board["panels"]
        for panel in board["panels"]:
            assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
            assert panel["datasource"]["uid"] == dashboards.DATASOURCE_UID
            assert all(
                t["datasource"]["uid"] == dashboards.DATASOURCE_UID for t in panel["targets"]
            )
        assert dashboards.expressions(text)
    ds = (
        ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
    ).read_text()
    assert f"uid: {dashboards.DATASOURCE_UID}" in ds


def test_subnet_places_nodes_and_is_checked() -> None:
    data = tomllib.loads((ROOT / SHIPPED).read_text())
    data["fabric"]["subnet"] = "10.9.0.0/24"
    topo = parse(data, "x.toml")
    assert [n.address for n in topo.nodes.values()][:2] == ["10.9.0.10", "10.9.0.11"]
    data["fabric"]["subnet"] = "10.9.0.0/29"
    with pytest.raises(TopologyError, match="too small"):
        parse(data, "x.toml")
    data["fabric"]["subnet"] = "not-a-net"
    with pytest.raises(TopologyError, match="subnet"):
        parse(data, "x.toml")


def test_the_default_compose_path_pulls_nothing() -> None:
    # every service the default `docker compose up` starts is built here (the nodes' image by
    # `docker build`, Prometheus by compose from Debian's package); Grafana, whose image comes
    # from a registry, only runs with --profile grafana
    for name in ("docker-compose.yml", "docker-compose.wall.yml"):
        _built_here((ROOT / name).read_text())
    dockerfile = (ROOT / "deploy" / "prometheus" / "Dockerfile").read_text()
    assert "apt-get install" in dockerfile and "prometheus" in dockerfile


def _built_here(text: str) -> None:
    services = text.split("\nservices:\n", 1)[1].split("\nnetworks:\n", 1)[0]
    blocks = re.split(r"\n(?=  \w[\w-]*:\n)", "\n" + services)
    checked = 0
    for block in filter(str.strip, blocks):
        name = block.strip().split(":", 1)[0]
        image = re.search(r"^    image: (\S+)$", block, re.M)
        assert image is not None, name
        if "    profiles:" in block:
            assert name == "grafana", name
            continue
        built = "    build:" in block or image.group(1) == "rocev2-emu:latest"
        assert built, f"{name} would be pulled: {image.group(1)}"
        checked += 1
    assert checked == 17  # the secret service, 14 nodes, the job, Prometheus


def test_every_bridge_network_is_jumbo_so_a_frame_is_one_datagram() -> None:
    """A 4 162-byte frame datagram over a 1 500-byte bridge is fragmented and refused a GSO
    send; the testbed's bridge carries it whole."""
    for name in ("docker-compose.yml", "docker-compose.wall.yml", "docker-compose.training.yml"):
        text = (ROOT / name).read_text()
        bridge = text[text.index("\nnetworks:\n") :]
        assert "driver: bridge" in bridge, name
        assert f'com.docker.network.driver.mtu: "{BRIDGE_MTU}"' in bridge, name
    assert BRIDGE_MTU >= 4162 + 28  # the datagram and its IPv4 and UDP headers
