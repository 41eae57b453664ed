# rocev2-emu: one image for switches, hosts and jobs; the role comes from the command line
# and the topology file.  BASE_IMAGE is any Debian-like image with python3 (>= 3.11) and its
# venv module: the public slim image by default, a local one where no registry is reachable
# (.ci/run builds it with mmdebstrap; see README "Testbed").
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# a C compiler and Python's headers: the wheel carries the cores compiled with mypyc (setup.py);
# the runtime stage needs neither
RUN if command -v apt-get >/dev/null; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            gcc libc6-dev python3-dev \
        && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY rocev2_emu rocev2_emu
COPY switch switch
COPY collectives collectives
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir -q --upgrade pip \
    && /opt/build/bin/pip wheel --no-cache-dir -q -w /wheels .

FROM ${BASE_IMAGE}
COPY --from=build /wheels /wheels
RUN python3 -m venv /opt/rocev2-emu \
    && /opt/rocev2-emu/bin/pip install --no-cache-dir -q --no-index --find-links /wheels rocev2-emu \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --create-home rocev2
# the example scripts (rocev2-emu launch ... -- python3 /opt/rocev2-emu/examples/ddp_train.py):
# the training image (deploy/torch) adds PyTorch to run them
COPY examples /opt/rocev2-emu/examples
ENV PATH=/opt/rocev2-emu/bin:$PATH
USER rocev2
# nodes serve /metrics on 9100 (compose starts them with --metrics-addr 0.0.0.0)
HEALTHCHECK --interval=2s --timeout=3s --start-period=5s --retries=30 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=2)"]
ENTRYPOINT ["rocev2-emu"]
CMD ["--help"]
