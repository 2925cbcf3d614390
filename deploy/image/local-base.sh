#!/usr/bin/env bash
# Builds a Debian bookworm + Python 3.11 base image locally with debootstrap, for machines that
# reach Debian's mirror and PyPI but not Docker Hub (where python:3.11-slim-bookworm lives).
# The result stands in for PYTHON_IMAGE (and, to measure Naiad's own layers, for CUDA_IMAGE):
#
#   deploy/image/local-base.sh                      # -> naiad-local-base/python:3.11-bookworm
#   docker build --network host --build-arg PYTHON_IMAGE=naiad-local-base/python:3.11-bookworm -t naiad:cpu .
#
# Needs root, debootstrap and a running Docker engine. The host's CA bundle is copied in so that
# pip inside the build trusts the same registries (and proxy) as the host.
set -euo pipefail
TAG="${1:-naiad-local-base/python:3.11-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/rootfs"

debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; exit 1; }
# python3.11-venv is installed in a second step: debootstrap's --include does not resolve its dependencies.
chroot "$ROOT" /bin/bash -c '
    set -e
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3.11 python3.11-venv ca-certificates >/dev/null
    ln -sf /usr/bin/python3.11 /usr/local/bin/python
    ln -sf /usr/bin/python3.11 /usr/local/bin/python3
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/*'
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
tar -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$TAG" >/dev/null
docker image ls "$TAG"
