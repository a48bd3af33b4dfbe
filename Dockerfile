# The inventory service and the node agent (same image, entrypoint llmgw-agent
# for the agent; on a GPU node without containers, install the agent's wheel
# alone: docs/agent/install.md).
#
#   docker build -t llmgw-inventory .
#
# The build stage builds and installs both distributions as a server's pip
# would: the service's build fetches GraphiQL's scripts from the npm registry
# (checked against Strawberry's pinned hashes; setup.py) and puts them and the
# migrations inside the package, so the image serves GraphiQL on an air-gapped
# cluster. The runtime stage is python:3.11-slim and that virtualenv alone,
# running as an unprivileged user.

# Base images by build argument, so a site with its own registry mirror (or the
# local stand-ins of deploy/base-images.sh, built from Debian's packages) uses
# this file unchanged: docker build --build-arg PYTHON_IMAGE=mirror/python:3.11-slim .
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/llmgw
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY alembic ./alembic
COPY service ./service
COPY agent ./agent
# Not editable: the image holds the installed packages, not this source. With
# the tracing extra: OTEL_* variables switch traces on (docs/operations/monitoring.md).
RUN /opt/llmgw/bin/pip install ./agent ".[tracing]" \
 && /opt/llmgw/bin/llmgw-inventory fetch-assets --check

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin llmgw
COPY --from=build /opt/llmgw /opt/llmgw
WORKDIR /opt/llmgw
ENV PATH=/opt/llmgw/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    INVENTORY_HOST=0.0.0.0 \
    INVENTORY_PORT=8080
USER llmgw
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["llmgw-inventory"]
CMD ["serve"]
