"""The testbed's images: their names and the Dockerfiles ``rocev2-emu compose`` writes
(Prometheus from Debian's package, the training image: the node image with PyTorch); the node
image's own Dockerfile is the repository's.
"""

from __future__ import annotations

IMAGE = "rocev2-emu:latest"
PROMETHEUS_IMAGE = "rocev2-emu-prometheus:latest"  # built by compose, from deploy/prometheus
BASE_IMAGE = "${ROCEV2_BASE_IMAGE:-debian:bookworm-slim}"  # where a registry is reachable
PROMETHEUS_DOCKERFILE = """\
# Prometheus from Debian's package, on the same kind of base as the node image, so that the
# testbed builds where no image registry is reachable (BASE_IMAGE: a local Debian base).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# policy-rc.d: the package must not start its daemon inside the build
RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
    && apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \\
    && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /prometheus && chown prometheus /prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus", "--storage.tsdb.path=/prometheus"]
"""
TORCH_IMAGE = "rocev2-emu-torch:latest"  # built by compose, from deploy/torch
TORCH_DOCKERFILE = """\
# The training image: the node image (its /opt/rocev2-emu/examples included) with PyTorch.
# wheels/: a torch wheel put here (a CPU build, say) is what is installed (its dependencies
# from PyPI); without one, pip takes torch from PyPI (for Linux, a CUDA build of several GB).
ARG IMAGE=rocev2-emu:latest
FROM ${IMAGE}
USER root
COPY wheels/ /wheels/
RUN set -e; pip="/opt/rocev2-emu/bin/pip install --no-cache-dir -q"; \\
    if ls /wheels/torch-*.whl >/dev/null 2>&1; then $pip /wheels/torch-*.whl; \\
    else $pip "torch>=2.4"; fi; \\
    rm -rf /wheels
USER rocev2
"""
GRAFANA_IMAGE = "grafana/grafana:11.1.0"
