"""``rocev2-emu compose TOPOLOGY``: the docker-compose testbed for any topology file.

Writes, under ``--out`` (default ``.``):

* ``docker-compose.yml`` - the testbed on the exact clock: one service per switch and host of
  the topology, each running ``rocev2-emu node --clock exact`` at a fixed address on one
  bridge network (``[fabric] subnet``, default 172.30.0.0/24: node i at .10 + i; MTU
  ``BRIDGE_MTU``, so a frame's datagram is neither fragmented nor refused a GSO send) and joining
  the coordinator that the ``job`` service serves (``bench all-reduce --attach --clock exact
  --sync``, at the top of the subnet; the nodes wait up to ``JOIN_TIMEOUT`` for it, the job
  for them), so that the job prints the virtual run's figures and the nodes end with it;
  ``prometheus``, built here from Debian's prometheus package on a local base
  (``ROCEV2_BASE_IMAGE``, the same base the node image is built on where no registry is
  reachable), so the default path pulls nothing; and ``grafana`` behind the compose profile
  ``grafana``, since its image comes from a registry.  No ``version:`` key and nothing
  v2-only (profiles came in docker-compose 1.28), so Debian's docker-compose 1.29 and
  ``docker compose`` v2 read the same file.
* ``docker-compose.wall.yml`` - the testbed on the wall clock: the nodes stay up (``rocev2-emu
  node``, dilated by the topology's TDF), a ``job`` that runs ``bench all-reduce --attach``
  once every node is healthy (``depends_on: condition: service_healthy``) and may run again,
  ``rocev2-emu link`` from the host at any moment; Prometheus and Grafana alike.
* ``docker-compose.training.yml`` - the same fabric training a model on the exact clock: the
  switches as nodes joining the run's coordinator, each host a rank of
  ``examples/ddp_train.py`` under DDP (``rocev2-emu launch --host --clock exact``: the host's
  NIC runs in the rank's process; the first host serves the coordinator on
  ``TRAIN_SYNC_PORT``, ``collectives.launcher.SYNC_PORT``), on the training image; Prometheus
  and Grafana alike.
* ``deploy/torch/Dockerfile`` - the training image: the node image (which carries
  ``examples/`` at ``/opt/rocev2-emu/examples``) with PyTorch (from a wheel put in
  ``deploy/torch/wheels/``, else PyPI).
* ``deploy/prometheus/Dockerfile`` - that Prometheus image.
* ``deploy/topology.toml`` - the topology with its subnet, mounted into every container.
* ``deploy/docker-stack.yml`` and ``deploy/topology-swarm.toml`` - the same fabric for
  ``docker stack deploy`` on a swarm (nodes found by name on an attachable overlay network),
  on the exact clock: the job serves the coordinator, the nodes join it by name.  With
  ``--workers N`` these two are all it writes, the stack of N worker services
  (:func:`stack_file`).
* ``deploy/prometheus/prometheus.yml`` - a scrape config listing every node (label ``role``;
  the metrics carry ``node`` themselves).
* ``deploy/grafana/`` - the datasource (fixed uid) and the three dashboards of
  :mod:`rocev2_emu.testbed.dashboards`, the same for every topology.
* ``deploy/fabric.secret`` - the fabric's control-plane secret (:mod:`rocev2_emu.control.auth`,
  mode 0600, never checked in), made once and kept when the files are written again.  The
  containers never read it themselves: a one-shot ``secret`` service (``rocev2-emu secret``,
  run as root with ``deploy/`` mounted) makes it when the checkout has none - a fresh clone
  starts with ``docker-compose up`` as it is - and copies it into the named volume ``secret``
  for the image's user; every node and the job wait for that service
  (``condition: service_completed_successfully``, docker-compose 1.29 and v2) and find the
  copy through ``ROCEV2_EMU_SECRET_FILE``.  No secret in git, in argv or in the environment;
  the host's ``rocev2-emu link deploy/topology.toml ...`` finds it beside the topology.

The checked-in files at the repository root are this module's output for the
shipped leaf-spine; a test fails when they drift.
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any

from rocev2_emu.control import auth
from rocev2_emu.testbed import dashboards
from rocev2_emu.testbed.images import IMAGE, PROMETHEUS_DOCKERFILE, TORCH_DOCKERFILE, TORCH_IMAGE
from rocev2_emu.testbed.monitoring import monitoring_services, prometheus_config
from rocev2_emu.topology.file import parse
from rocev2_emu.topology.generate import to_toml
from rocev2_emu.topology.model import Node, NodeKind, Topology, refuse_split_servers
from rocev2_emu.topology.processes import process_groups

DEFAULT_SUBNET = "172.30.0.0/24"
# The bridge's MTU: jumbo, as a RoCE fabric's links are.  A 4 096-byte RoCE frame is a 4 162-byte
# VXLAN datagram; over the default 1 500 the kernel fragments each and refuses the wall-clock
# ports' GSO sends (runtime/ports.py falls back to one datagram per call there).
BRIDGE_MTU = 9000
TRAIN_SCRIPT = "/opt/rocev2-emu/examples/ddp_train.py"
TRAIN_STEPS = 5
# wall seconds a rank keeps /metrics served after training (the rank's ROCEV2_METRICS_LINGER):
# three of Prometheus' 2 s scrapes, so a run shorter than a scrape still shows its last step
TRAIN_METRICS_LINGER = 6.0
TRAIN_COMPUTE_MS = 0.2  # the modelled accelerator compute per step (docs/pytorch.md)
TRAIN_SYNC_PORT = 29600  # the training run's coordinator on the first host (launch --host)
TOPOLOGY_IN_CONTAINER = "/etc/rocev2-emu/topology.toml"
SECRET_DIR = "/run/rocev2-emu"  # the named volume ``secret``: the containers' copy
SECRET_IN_CONTAINER = f"{SECRET_DIR}/{auth.BESIDE_TOPOLOGY}"
JOB_SIZES = ["-b", "1K", "-e", "4M", "-f", "4", "-n", "2", "-w", "1"]
JOB_COMMAND = ["bench", "all-reduce", "--attach", "--topology", TOPOLOGY_IN_CONTAINER, *JOB_SIZES]
SYNC_PORT = 7470  # the exact testbed's coordinator, served by its job
JOIN_TIMEOUT = 300  # wall seconds a node container waits for the job's coordinator


def job_serving_sync(sync: str, workers: int | None = None) -> list[str]:
    """The exact testbed's job: the benchmark, serving the run's coordinator at ``sync``
    (``workers``: its nodes in that many processes, a stack's worker services)."""
    head = ["bench", "all-reduce", "--attach", "--clock", "exact", "--sync", sync]
    if workers is not None:
        head += ["--workers", str(workers)]
    return [*head, "--topology", TOPOLOGY_IN_CONTAINER, *JOB_SIZES]


def with_subnet(data: dict[str, Any], subnet: str) -> dict[str, Any]:
    return {**data, "fabric": {**data.get("fabric", {}), "subnet": subnet}}


def _list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{x}"' for x in items) + "]"


def _secret_service() -> list[str]:
    """The one-shot service every other one waits for: it makes ``deploy/fabric.secret`` when
    the checkout has none (a fresh clone; owned by whoever owns ``deploy/``) and copies it into
    the volume ``secret``, readable by the image's user only."""
    command = ["secret", f"/deploy/{auth.BESIDE_TOPOLOGY}", "--share", SECRET_IN_CONTAINER]
    return [
        "  secret:",
        f"    image: {IMAGE}",
        "    user: root",
        f"    command: {_list(command)}",
        "    volumes:",
        "      - ./deploy:/deploy",
        f"      - secret:{SECRET_DIR}",
        "    healthcheck:",
        "      disable: true",
        "    network_mode: none",
    ]


def _with_secret(*environment: str) -> list[str]:
    """What a service needs to prove the secret: the volume, the variable naming the file,
    and the secret service done first (followed by the service's other dependencies);
    ``environment``: more variables (``NAME=value``)."""
    return [
        "    environment:",
        f"      - {auth.ENV_FILE}={SECRET_IN_CONTAINER}",
        *[f"      - {variable}" for variable in environment],
        "    volumes:",
        f"      - ./deploy/topology.toml:{TOPOLOGY_IN_CONTAINER}:ro",
        f"      - secret:{SECRET_DIR}:ro",
        "    depends_on:",
        "      secret:",
        "        condition: service_completed_successfully",
    ]


def _node_command(name: str, sync: str | None = None) -> list[str]:
    """A node container's command (``sync``: a node of the exact run whose coordinator is
    there, waited for up to ``JOIN_TIMEOUT``)."""
    command = ["node", TOPOLOGY_IN_CONTAINER, name, "--metrics-addr", "0.0.0.0"]
    if sync is not None:
        command += ["--clock", "exact", "--sync", sync, "--join-timeout", str(JOIN_TIMEOUT)]
    return command


def _worker_command(names: list[str], workers: int, sync: str) -> list[str]:
    """A worker service's command: the nodes ``names``, one process of ``--workers``."""
    command = ["node", TOPOLOGY_IN_CONTAINER, ",".join(names), "--clock", "exact"]
    return [
        *command,
        "--workers",
        str(workers),
        "--sync",
        sync,
        "--join-timeout",
        str(JOIN_TIMEOUT),
    ]


def _node_service(node: Node, sync: str | None = None) -> list[str]:
    """A node's container (``sync``: a node of the exact run whose coordinator is there)."""
    command = _node_command(node.name, sync)
    return [
        f"  {node.name}:",
        f"    image: {IMAGE}",
        f"    command: {_list(command)}",
        *_with_secret(),
        "    networks:",
        "      fabric:",
        f"        ipv4_address: {node.address}",
    ]


def _addresses(topo: Topology, subnet: str) -> dict[str, ipaddress.IPv4Address]:
    """The job's and the monitoring's addresses, at the top of the subnet."""
    last = ipaddress.IPv4Network(subnet).broadcast_address
    extra = {"job": last - 4, "prometheus": last - 3, "grafana": last - 2}
    if int(extra["job"]) <= max(int(ipaddress.IPv4Address(n.address)) for n in topo.nodes.values()):
        raise ValueError(f"subnet {subnet} is too small for {len(topo.nodes)} nodes and 3 more")
    return extra


def compose_file(topo: Topology, source: str, subnet: str) -> str:
    """The exact testbed: every node a container on the exact clock, joining the coordinator
    its job serves; the job prints the virtual run's figures, and the nodes end with it."""
    extra = _addresses(topo, subnet)
    sync = f"{extra['job']}:{SYNC_PORT}"
    out = [
        f"# generated by: rocev2-emu compose {source}",
        "# The testbed on the exact clock: every switch and host a container on one bridge",
        "# network, each on its own event engine, joining the coordinator that the job (the",
        "# all-reduce benchmark) serves; the job prints the figures `bench all-reduce --virtual`",
        "# prints for this topology, and the nodes end with it.  Prometheus (localhost:9090,",
        "# built here from Debian's package) and, with --profile grafana, Grafana",
        "# (localhost:3000, pulled from a registry) show the run in emulated time.  Build the",
        "# node image first (README, Testbed):",
        "#   docker build -t rocev2-emu:latest .",
        "# docker-compose.wall.yml: a fabric that stays up on the wall clock (jobs attach to it);",
        "# docker-compose.training.yml: the same fabric training a PyTorch model.",
        "services:",
        *_secret_service(),
    ]
    for node in topo.nodes.values():
        out += _node_service(node, sync)
    # the job waits for the nodes started, not healthy: they serve once they have joined
    out += _job_service(topo, job_serving_sync(sync), "service_started", extra)
    return "\n".join([*out, *monitoring_services(extra, subnet, BRIDGE_MTU)])


def live_file(topo: Topology, source: str, subnet: str) -> str:
    """The live testbed, on the wall clock (dilated by the topology's TDF): a fabric that stays
    up, every node a container, a job that attaches once every node is healthy."""
    extra = _addresses(topo, subnet)
    out = [
        f"# generated by: rocev2-emu compose {source}",
        "# The testbed on the wall clock (dilated by the topology's TDF): every switch and host a",
        "# container on one bridge network that stays up, a job that runs the all-reduce",
        "# benchmark once the fabric is healthy (run it again: docker-compose -f",
        "# docker-compose.wall.yml run --rm job), `rocev2-emu link deploy/topology.toml ...` from",
        "# the host; Prometheus and Grafana as in docker-compose.yml.  Its figures depend on how",
        "# punctually the machine runs the containers (the job warns when they fell behind);",
        "# docker-compose.yml runs the same job on the exact clock.",
        "services:",
        *_secret_service(),
    ]
    for node in topo.nodes.values():
        out += _node_service(node)
    out += _job_service(topo, JOB_COMMAND, "service_healthy", extra)
    return "\n".join([*out, *monitoring_services(extra, subnet, BRIDGE_MTU)])


def _job_service(
    topo: Topology, command: list[str], condition: str, extra: dict[str, ipaddress.IPv4Address]
) -> list[str]:
    """The job's service: ``command``, once every node's container meets ``condition``."""
    out = ["  job:", f"    image: {IMAGE}", f"    command: {_list(command)}", *_with_secret()]
    for node in topo.nodes.values():
        out += [f"      {node.name}:", f"        condition: {condition}"]
    return [
        *out,
        "    healthcheck:",
        "      disable: true",
        "    networks:",
        "      fabric:",
        f"        ipv4_address: {extra['job']}",
    ]


def training_file(topo: Topology, source: str, subnet: str) -> str:
    """The same fabric training a model on the exact clock: the switches as nodes joining the
    run's coordinator, and each host a rank of ``examples/ddp_train.py`` under DDP (``launch
    --host --clock exact``: the host's NIC runs in the rank's process; the first host serves
    the rendezvous and the coordinator), on the training image."""
    extra = _addresses(topo, subnet)
    sync = f"{topo.hosts[0].address}:{TRAIN_SYNC_PORT}"
    out = [
        f"# generated by: rocev2-emu compose {source}",
        "# The training testbed on the exact clock: every switch a container joining the run's",
        "# coordinator, every host a rank of examples/ddp_train.py"
        f" ({TRAIN_STEPS} DDP steps, --compute-ms {TRAIN_COMPUTE_MS:g})",
        "# whose process is the host's NIC, on the training image (deploy/torch: the node image",
        f"# with PyTorch); the first host ({topo.hosts[0].name}) serves the coordinator, and every",
        "# run reports the same emulated communication per step.  Prometheus and Grafana as in",
        "# docker-compose.yml.  Build the node image, then:",
        "#   docker-compose -f docker-compose.training.yml up",
        "services:",
        *_secret_service(),
    ]
    switches = [n for n in topo.nodes.values() if n.kind is NodeKind.SWITCH]
    for node in switches:
        out += _node_service(node, sync)
    for host in topo.hosts:
        command = ["launch", TOPOLOGY_IN_CONTAINER, "--host", host.name, "--clock", "exact"]
        command += ["--job", "train", "--compute-ms", f"{TRAIN_COMPUTE_MS:g}"]
        command += ["--", "python3", TRAIN_SCRIPT, "--steps", str(TRAIN_STEPS)]
        out += [
            f"  {host.name}:",
            "    build:",
            "      context: ./deploy/torch",
            f"    image: {TORCH_IMAGE}",
            f"    command: {_list(command)}",
            *_with_secret(f"ROCEV2_METRICS_LINGER={TRAIN_METRICS_LINGER:g}"),
            # started, not healthy: a switch serves only once it has joined the coordinator
            *[f"      {sw.name}:\n        condition: service_started" for sw in switches],
            "    healthcheck:",
            "      disable: true",
            "    networks:",
            "      fabric:",
            f"        ipv4_address: {host.address}",
        ]
    out += monitoring_services(extra, subnet, BRIDGE_MTU)
    return "\n".join(out)


def stack_file(topo: Topology, source: str, workers: int | None = None) -> str:
    """The same fabric for ``docker stack deploy``: an attachable overlay network, nodes that
    find each other by name (``endpoint_mode: dnsrr``, so a name resolves to the task itself;
    no healthcheck, since swarm puts a task in DNS only once it is healthy and a node needs
    the names before it serves), the topology as a swarm config, and a job that runs once -
    on the exact clock, as ``docker-compose.yml``: the job serves the coordinator on every
    address of its task, the nodes join it by its name.  ``workers``: not a service per node
    but that many worker services, each the process ``--workers`` would give a group of nodes
    (:func:`~rocev2_emu.topology.processes.process_groups`), its nodes' names the aliases of its
    task.  Build and tag the image on every machine first (stack deploy does not build)."""
    out = [
        f"# generated by: rocev2-emu compose {source}"
        + (f" --workers {workers}" if workers is not None else ""),
        "# docker swarm: docker stack deploy -c deploy/docker-stack.yml rocev2",
        "# On the exact clock: the job serves the run's coordinator, every node joins it.",
        'version: "3.8"',
        "services:",
    ]
    services: list[tuple[str, list[str], list[str]]] = [
        (name, _node_command(name, f"job:{SYNC_PORT}"), []) for name in topo.nodes
    ]
    if workers is not None:
        groups = process_groups(topo, workers)
        services = [
            (f"worker{i}", _worker_command(group, workers, f"job:{SYNC_PORT}"), group)
            for i, group in enumerate(groups)
        ]
    services.append(("job", job_serving_sync(f"0.0.0.0:{SYNC_PORT}", workers), []))
    for name, argv, aliases in services:
        network = ["      - fabric"]
        if aliases:
            network = ["      fabric:", "        aliases:", *[f"          - {a}" for a in aliases]]
        out += [
            f"  {name}:",
            f"    image: {IMAGE}",
            f"    command: {_list(argv)}",
            f"    env_file: ./{auth.BESIDE_TOPOLOGY}",
            "    configs:",
            "      - source: topology",
            f"        target: {TOPOLOGY_IN_CONTAINER}",
            "    healthcheck:",  # swarm adds a task to DNS only once healthy; names come first
            "      disable: true",
            "    networks:",
            *network,
            "    deploy:",
            "      endpoint_mode: dnsrr",
            "      restart_policy:",
            "        condition: none",
        ]
    out += [
        "configs:",
        "  topology:",
        "    file: ./topology-swarm.toml",
        "networks:",
        "  fabric:",
        "    driver: overlay",
        "    attachable: true",
        "",
    ]
    return "\n".join(out)


def generate(
    topology_path: str, out: str, subnet: str = DEFAULT_SUBNET, workers: int | None = None
) -> list[Path]:
    """Write the testbed's files for ``topology_path`` under ``out``; the paths written.
    ``workers``: only the swarm stack, of that many worker services (:func:`stack_file`) - a
    container per node is no deployment for a cluster of thousands."""
    data = tomllib.loads(Path(topology_path).read_text())
    root = Path(out)
    swarm = {
        root / "deploy" / "topology-swarm.toml": f"# generated by: rocev2-emu compose "
        f"{topology_path}\n" + to_toml(with_subnet(data, "dns")),
    }
    if workers is not None:
        topo = parse(with_subnet(data, "dns"), topology_path)
        swarm[root / "deploy" / "docker-stack.yml"] = stack_file(topo, topology_path, workers)
        return _write(root, swarm)
    data = with_subnet(data, subnet)
    topo = parse(data, topology_path)
    refuse_split_servers(topo)  # a container per node
    files = {
        root / "docker-compose.yml": compose_file(topo, topology_path, subnet),
        root / "docker-compose.wall.yml": live_file(topo, topology_path, subnet),
        root / "deploy" / "topology.toml": f"# generated by: rocev2-emu compose {topology_path}\n"
        + to_toml(data),
        root / "deploy" / "prometheus" / "prometheus.yml": prometheus_config(topo, topology_path),
        root / "deploy" / "prometheus" / "Dockerfile": PROMETHEUS_DOCKERFILE,
        **swarm,
        root / "deploy" / "docker-stack.yml": stack_file(topo, topology_path),
        root / "docker-compose.training.yml": training_file(topo, topology_path, subnet),
        root / "deploy" / "torch" / "Dockerfile": TORCH_DOCKERFILE,
        root / "deploy" / "torch" / "wheels" / "README": "A torch wheel put here is what the "
        "training image installs (deploy/torch/Dockerfile); without one, pip takes PyPI's.\n",
    }
    for rel, text in dashboards.files().items():
        files[root / "deploy" / "grafana" / rel] = text
    return _write(root, files)


def _write(root: Path, files: dict[Path, str]) -> list[Path]:
    """``files`` written, and the fabric's secret beside them unless there is one already."""
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    secret = root / "deploy" / auth.BESIDE_TOPOLOGY
    if not secret.exists():  # a running testbed keeps its secret when the files are rewritten
        auth.write(secret, auth.new(), exclusive=True)
    return [*files, secret]
