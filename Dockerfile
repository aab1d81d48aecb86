# One image for every gpupool role; the first argument picks it:
#   docker run gpupool/gpupool scheduler | agent | webhook | simulate | demo
# Build: docker build -t gpupool/gpupool:0.1.0 .
# Here (no registry, no Docker engine): scripts/image build, with buildah and a Debian base made by
# mmdebstrap (docs/install.md). Both bases work: python:3.11-slim-bookworm has its Python in /usr/local/bin,
# Debian's python3 package in /usr/bin; everything below names only `python3` on PATH.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The wheel carries the CUDA interception library (native/), compiled with the system C compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY src ./src
COPY data ./data
COPY native ./native
# Build a wheel and install it (not editable) into a self-contained virtual environment; the wheel puts the
# bundled trace (for `gpupool simulate`) under /opt/gpupool/share/gpupool/traces. pip and setuptools leave
# the environment afterwards: the image installs nothing at run time. The installed modules are compiled
# here (compileall), so a read-only root file system never needs a .pyc written.
RUN python3 -m venv /opt/gpupool \
 && /opt/gpupool/bin/pip install --upgrade pip \
 && /opt/gpupool/bin/pip wheel --no-deps -w /tmp/wheels . \
 && /opt/gpupool/bin/pip install /tmp/wheels/*.whl \
 && /opt/gpupool/bin/python3 -m pip uninstall -y pip setuptools \
 && /opt/gpupool/bin/python3 -m compileall -q /opt/gpupool/lib \
 && /opt/gpupool/bin/gpupool --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpupool" \
      org.opencontainers.image.description="Share the GPUs of a Kubernetes cluster as one pool" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpupool /opt/gpupool
ENV PATH=/opt/gpupool/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (scheduler, webhook). The chart runs only the node agent as uid 0, because the
# kubelet's device-plugin directory is root-owned.
USER 65532:65532
ENTRYPOINT ["gpupool"]
CMD ["--help"]
