#!/bin/sh
# docker-compose.yml's PostgreSQL: a restore requested on the repository volume
# (deploy/restore.sh) fills an empty data directory from the repository first, then
# the backup schedule starts beside PostgreSQL and the base image's entrypoint runs
# (PostgreSQL in the foreground, with the archive settings of compose's command).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
as_postgres() { if [ "$(id -u)" = 0 ]; then gosu postgres "$@"; else "$@"; fi; }
if [ -s /var/lib/pgbackrest/llmgw-restore-request.json ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  echo "single-entrypoint: restoring $(cat /var/lib/pgbackrest/llmgw-restore-request.json)"
  as_postgres llmgw-backup bootstrap --datadir "$PGDATA"
fi
as_postgres llmgw-backup schedule &
for entrypoint in /usr/local/bin/docker-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh; do
  [ -x "$entrypoint" ] && exec "$entrypoint" "$@"
done
echo "single-entrypoint: the base image's entrypoint is not found" >&2
exit 1
