# The inventory service (and the node agent: same image, entrypoint llmgw-agent).
#
#   docker build -t llmgw-inventory .
#
# Node.js and npm exist only in the build stage: they fetch GraphiQL's scripts
# (checked against Strawberry's pinned hashes) so the image serves GraphiQL on
# an air-gapped cluster. The runtime stage is python:3.11-slim, a virtualenv and
# the source, running as an unprivileged user.

# Base images by build argument, so a site with its own registry mirror (or the
# local stand-ins of deploy/base-images.sh, built from Debian's packages) uses
# this file unchanged: docker build --build-arg PYTHON_IMAGE=mirror/python:3.11-slim .
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/llmgw
WORKDIR /app
COPY pyproject.toml README.md ./
COPY alembic ./alembic
COPY service ./service
COPY agent ./agent
# Editable: the migrations are read from /app/alembic beside the package.
RUN /opt/llmgw/bin/pip install -e . \
 && /opt/llmgw/bin/llmgw-inventory fetch-assets \
 && /opt/llmgw/bin/llmgw-inventory fetch-assets --check \
 && rm -rf /root/.npm

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin llmgw
COPY --from=build /opt/llmgw /opt/llmgw
COPY --from=build /app /app
WORKDIR /app
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
