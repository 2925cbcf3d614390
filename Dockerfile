# syntax=docker/dockerfile:1
# Naiad CPU image: a slim, non-root Python 3.11 image serving a Triton model repository.
#
#   docker build -t naiad:cpu .
#   docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 naiad:cpu                 # example models
#   docker run --rm -p 8000:8000 -v "$PWD/my_models:/models:ro" naiad:cpu             # your repository
#   docker run --rm naiad:cpu --model-repository=/models --log-verbose=1               # any `naiad serve` flag
#   docker build --build-arg NAIAD_EXTRAS=s3 -t naiad:cpu .                             # + s3:// repositories
#
# Size (measured 2026-11-22 on a Debian bookworm + Python 3.11 stand-in base of 156 MB, see
# docs/deploy.md): 380 MB uncompressed (the /opt/naiad venv is 223 MB), 144 MB compressed.
# Compare tritonserver's CPU-capable images at 10+ GB.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Optional extras of the naiad package, comma-separated: s3, gcs, azure or cloud (object-storage repositories).
ARG NAIAD_EXTRAS=""

# ---------------------------------------------------------------- build: resolve and install into a venv
FROM ${PYTHON_IMAGE} AS build
ARG NAIAD_EXTRAS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/naiad
WORKDIR /src
# Dependencies first (pinned in pyproject.toml), so code edits do not invalidate this layer.
COPY pyproject.toml README.md ./
COPY src/ ./src/
RUN /opt/naiad/bin/pip install --no-compile ".${NAIAD_EXTRAS:+[${NAIAD_EXTRAS}]}" \
    && find /opt/naiad -name '__pycache__' -type d -prune -exec rm -rf {} + \
    && find /opt/naiad -name 'tests' -path '*site-packages/*' -type d -prune -exec rm -rf {} +

# ---------------------------------------------------------------- runtime: venv + example models, no compilers
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="naiad" \
      org.opencontainers.image.description="Triton-compatible inference server in Python (KServe v2 over HTTP and gRPC), CPU" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH="/opt/naiad/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OMP_NUM_THREADS=1
RUN groupadd --system --gid 10001 naiad \
    && useradd --system --uid 10001 --gid naiad --home-dir /home/naiad --create-home --shell /usr/sbin/nologin naiad
COPY --from=build /opt/naiad /opt/naiad
# The example repository; mount your own over /models (a volume, a ConfigMap, an initContainer's emptyDir).
COPY --chown=naiad:naiad examples/models/ /models/
USER 10001:10001
WORKDIR /home/naiad
# 8000 HTTP/REST, 8001 gRPC, 8002 metrics, 8080 SageMaker / Vertex AI (when enabled)
EXPOSE 8000 8001 8002 8080
# Readiness of the HTTP port (8000, or NAIAD_HEALTH_PORT when --http-port moves it), with the
# interpreter the image already has (no curl needed).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('NAIAD_HEALTH_PORT', '8000'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/v2/health/ready', timeout=4).status == 200 else 1)"]
# SIGTERM stops readiness, drains in-flight requests (--exit-timeout-secs), then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["naiad", "serve"]
CMD ["--model-repository=/models"]
