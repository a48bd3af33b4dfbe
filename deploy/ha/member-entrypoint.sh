#!/bin/sh
# Each HA member's entrypoint: Patroni as PID 1 (patroni.Dockerfile says why), with the
# backup schedule (deploy/backup/llmgw_backup.py) started first as its child, so the
# container's death takes both. Patroni reads a directory of settings, in name order:
# the mounted patroni.yml, then, when a restore was requested on the repository volume
# (deploy/restore.sh), the custom bootstrap that restores it. The bootstrap section is
# only read when the cluster is initialised, so on a member of a running cluster the
# request changes nothing.
set -eu
conf=/tmp/patroni
mkdir -p "$conf"
cp /etc/patroni/patroni.yml "$conf/00-patroni.yml"
rm -f "$conf/50-restore.yml"
if [ -s /var/lib/pgbackrest/llmgw-restore-request.json ]; then
  cat > "$conf/50-restore.yml" <<'YAML'
bootstrap:
  method: llmgw_restore
  llmgw_restore:
    command: llmgw-backup bootstrap
    # pgBackRest writes the recovery target (time, or the end of the archive) and its
    # restore_command; PostgreSQL recovers to it and promotes: a new timeline.
    keep_existing_recovery_conf: true
YAML
  echo "member-entrypoint: a restore is requested: $(cat /var/lib/pgbackrest/llmgw-restore-request.json)"
fi
llmgw-backup schedule &
exec patroni "$conf"
