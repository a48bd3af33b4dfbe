# PostgreSQL 15 from Debian bookworm, managed by Patroni from PyPI (pinned in
# patroni-requirements.txt; not Debian's 3.0.2, see there). One image for every
# member: its name, addresses and passwords come from the environment
# (docker-compose.ha.yml, .env), its settings from the mounted patroni.yml; no
# secret is in the image.
#
# Patroni is the container's PID 1 (it then acts as init and runs the daemon as
# its child): PostgreSQL's postmaster is detached from Patroni, so with Patroni
# as a child of something else, killing Patroni would leave PostgreSQL running
# as a primary nobody manages; as PID 1, the container's death takes both.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
RUN mkdir -p /etc/postgresql-common/createcluster.d \
 && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/no-main.conf \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 python3-psycopg2 python3-venv curl \
      pgbackrest \
 && rm -rf /var/lib/apt/lists/*
COPY ha/patroni-requirements.txt /tmp/patroni-requirements.txt
# System site packages: Debian's psycopg2, built against the same libpq.
RUN python3 -m venv --system-site-packages /opt/patroni \
 && /opt/patroni/bin/pip install --no-cache-dir --disable-pip-version-check \
      -r /tmp/patroni-requirements.txt \
 && rm /tmp/patroni-requirements.txt \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql /etc/patroni /var/lib/pgbackrest \
      /usr/local/share/llmgw \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql /var/lib/pgbackrest \
 && chmod 0700 /var/lib/postgresql/data /var/lib/pgbackrest
COPY ha/post-bootstrap.sh /usr/local/bin/ha-post-bootstrap
COPY ha/member-entrypoint.sh /usr/local/bin/member-entrypoint
COPY backup/llmgw_backup.py /usr/local/bin/llmgw-backup
COPY backup/status.sql /usr/local/share/llmgw/status.sql
COPY backup/pgbackrest.conf /etc/pgbackrest/pgbackrest.conf
ENV PATH=/opt/patroni/bin:/usr/lib/postgresql/15/bin:$PATH \
    PATRONICTL_CONFIG_FILE=/etc/patroni/patroni.yml
USER postgres
EXPOSE 5432 8008
# patroni.yml is mounted in /etc/patroni by docker-compose.ha.yml.
ENTRYPOINT ["member-entrypoint"]
