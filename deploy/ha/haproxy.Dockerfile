# HAProxy 2.6 from Debian bookworm: routes the service's PostgreSQL connections
# to the member Patroni says is the primary (haproxy.cfg, mounted by
# docker-compose.ha.yml).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
USER haproxy
EXPOSE 5000 5011 5012 5013
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
