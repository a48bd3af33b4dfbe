# etcd 3.4 from Debian bookworm (etcd-server; etcdctl from etcd-client for health
# checks and operators). It serves the v3 API only, which Patroni's etcd3 backend
# speaks. Flags come from ETCD_* variables (docker-compose.ha.yml).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/etcd \
 && chown nobody:nogroup /var/lib/etcd
ENV ETCDCTL_API=3
USER nobody
EXPOSE 2379 2380
ENTRYPOINT ["etcd"]
