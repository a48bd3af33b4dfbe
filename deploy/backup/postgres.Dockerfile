# docker-compose.yml's PostgreSQL with pgBackRest: POSTGRES_IMAGE (the public
# postgres image, or deploy/base-images.sh's Debian stand-in) plus Debian's
# pgbackrest, the backup schedule and the restore's bootstrap
# (deploy/backup/llmgw_backup.py, docs/operations/backup.md). Build context: deploy/.
# RUN_AS: the user the base image runs as (postgres for the stand-in; the public
# image starts as root and steps down itself).
ARG BASE
FROM ${BASE}
ARG RUN_AS=postgres
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends pgbackrest \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/pgbackrest /usr/local/share/llmgw /var/run/postgresql \
 && chown postgres:postgres /var/lib/pgbackrest /var/run/postgresql \
 && chmod 0700 /var/lib/pgbackrest
COPY backup/llmgw_backup.py /usr/local/bin/llmgw-backup
COPY backup/status.sql /usr/local/share/llmgw/status.sql
COPY backup/pgbackrest.conf /etc/pgbackrest/pgbackrest.conf
COPY backup/single-entrypoint.sh /usr/local/bin/single-entrypoint
USER ${RUN_AS}
ENTRYPOINT ["single-entrypoint"]
