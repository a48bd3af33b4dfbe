#!/usr/bin/env bash
# Restore the inventory to a time (or the latest moment the archive holds), as a new
# cluster on a new timeline, from the pgBackRest repository. docs/operations/backup.md.
#
#   bash deploy/restore.sh --to 2026-12-07T10:15:00Z                 # docker-compose.ha.yml
#   bash deploy/restore.sh --to latest
#   bash deploy/restore.sh -f docker-compose.yml --to 2026-12-07T10:15:00Z   # the single-node demo
#   (-p PROJECT as for docker-compose; the environment and .env as for `up`.)
#
# In order, each step only once the one before succeeded:
# 1. The target is checked against the repository: before the oldest backup's end or
#    in the future, it is refused naming the restorable range, and nothing changes.
# 2. The old cluster is fenced, so that the old and the new never both take writes:
#    the service processes are stopped (nothing writes through them), the current
#    primary's WAL is switched and archived (what was acknowledged is in the archive)
#    and its last fence read, then every database member is stopped, and the script
#    goes on only once Docker reports none of them running. Their leader lock and
#    cluster state are removed from etcd, and their data volumes deleted: an old
#    member can never come back as a primary (a member started later is rebuilt as
#    a replica of the new leader).
# 3. The first member bootstraps from the repository (Patroni's custom bootstrap:
#    llmgw-backup bootstrap): PostgreSQL recovers to the target and promotes, on a new
#    timeline. Then the other members start empty and are built as its replicas, from
#    a backup on the new timeline's history or by pg_basebackup (never from a backup
#    of the abandoned timeline: patroni #3147), and the script waits until they
#    stream on the leader's timeline.
# 4. `llmgw-inventory after-restore` moves the fence sequence past the old cluster's
#    and records an event `restored` with the target; the service processes start
#    again and reconnect; agents' next reports bring the nodes' facts back.
set -euo pipefail
cd "$(dirname "$0")/.."

file=docker-compose.ha.yml
project=()
target=""
while [ $# -gt 0 ]; do
  case "$1" in
    -f) file="$2"; shift 2 ;;
    -p) project=(-p "$2"); shift 2 ;;
    --to) target="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "restore: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$target" ] || { echo "restore: --to TIME (ISO 8601, UTC unless an offset is given) or --to latest" >&2; exit 2; }
compose() { docker-compose "${project[@]}" -f "$file" "$@"; }
say() { echo "restore: $(date -u +%H:%M:%S) $*"; }
started=$(date +%s)

if [ "$file" = docker-compose.yml ]; then
  members=(postgres); services=(inventory-1 inventory-2)
else
  members=(pg-1 pg-2 pg-3); services=(inventory-1 inventory-2)
fi
first=${members[0]}

running() {  # the member's container exists and runs
  local id; id=$(compose ps -q "$1" 2>/dev/null || true)
  [ -n "$id" ] && [ "$(docker inspect -f '{{.State.Status}}' "$id" 2>/dev/null)" = running ]
}
repo_tool() {  # llmgw-backup ARGS where the repository is mounted
  local m
  for m in "${members[@]}"; do
    if running "$m"; then compose exec -T "$m" llmgw-backup "$@"; return; fi
  done
  # No member runs (so none holds its fixed address): a one-off container of the first.
  compose run --rm --no-deps -T --entrypoint llmgw-backup "$first" "$@"
}

# 1. The target against the repository.
say "checking $target against the repository"
repo_tool request-restore "$target"
as_superuser() {  # SQL on a member, as the database's superuser over its socket
  local user=postgres; [ "$file" = docker-compose.yml ] && user=llmgw
  compose exec -T "$1" psql -X -qAt -v ON_ERROR_STOP=1 -U "$user" -d "${2:-postgres}" -c "$3"
}

# 2. Fence the old cluster.
say "stopping the service processes: ${services[*]}"
compose stop "${services[@]}" >/dev/null
fence_floor=""
for m in "${members[@]}"; do
  running "$m" || continue
  if [ "$(as_superuser "$m" postgres 'SELECT NOT pg_is_in_recovery()' 2>/dev/null || true)" = t ]; then
    wal=$(as_superuser "$m" postgres "SELECT pg_walfile_name(pg_switch_wal())" 2>/dev/null || true)
    say "primary $m: switched WAL at $wal; waiting for it to be archived"
    for _ in $(seq 1 60); do
      done_wal=$(as_superuser "$m" postgres "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver" 2>/dev/null || true)
      [ -n "$wal" ] && [ "${done_wal:0:24}" \> "$wal" -o "${done_wal:0:24}" = "$wal" ] && break
      sleep 1
    done
    fence_floor=$(as_superuser "$m" llmgw "SELECT last_value FROM shard_fence" 2>/dev/null || true)
    say "old cluster's last fence: ${fence_floor:-unknown}"
  fi
done
say "stopping the database members: ${members[*]}"
compose stop "${members[@]}" >/dev/null
for m in "${members[@]}"; do
  if running "$m"; then
    echo "restore: $m still runs after docker-compose stop: refusing to start a second cluster beside it" >&2
    exit 1
  fi
done
volumes=()
for m in "${members[@]}"; do
  id=$(compose ps -q "$m" 2>/dev/null || true)
  [ -n "$id" ] || continue
  while read -r name dest; do
    [ "$dest" = /var/lib/postgresql/data ] && volumes+=("$name")
  done < <(docker inspect -f '{{range .Mounts}}{{.Name}} {{.Destination}}{{"\n"}}{{end}}' "$id")
done
if [ "$file" != docker-compose.yml ]; then
  say "removing the old cluster's state from etcd"
  compose exec -T etcd-1 etcdctl --endpoints=http://127.0.0.1:2379 del --prefix /patroni/llmgw/ >/dev/null
fi
compose rm -f "${members[@]}" >/dev/null
[ ${#volumes[@]} -eq 0 ] || docker volume rm "${volumes[@]}" >/dev/null
say "old members and their data removed (${volumes[*]:-no volumes})"

# 3. The new cluster.
wait_until() {  # what, seconds, command...
  local what=$1 within=$2; shift 2
  local deadline=$(( $(date +%s) + within ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "restore: gave up waiting for $what after ${within}s" >&2; exit 1; fi
    sleep 2
  done
}
say "bootstrapping $first from the repository to $target"
compose up -d --no-deps "$first" >/dev/null
if [ "$file" = docker-compose.yml ]; then
  wait_until "$first to take writes" 3600 as_superuser "$first" postgres "SELECT 1 WHERE NOT pg_is_in_recovery()"
  primary_ok() { [ "$(as_superuser "$first" postgres 'SELECT NOT pg_is_in_recovery()')" = t ]; }
  wait_until "$first out of recovery" 3600 primary_ok
else
  wait_until "$first to be the leader" 3600 compose exec -T "$first" curl -fsS -o /dev/null http://127.0.0.1:8008/primary
fi
repo_tool clear-request
timeline=$(as_superuser "$first" postgres "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int")
say "$first restored, on timeline $timeline"
if [ ${#members[@]} -gt 1 ]; then
  compose up -d --no-deps "${members[@]:1}" >/dev/null
  settled() {
    compose exec -T "$first" curl -fsS http://127.0.0.1:8008/cluster | python3 -c '
import json, sys
members = json.load(sys.stdin)["members"]
timelines = {m.get("timeline") for m in members}
ok = len(members) == 3 and len(timelines) == 1 and all(
    m["state"] in ("running", "streaming") for m in members)
sys.exit(0 if ok else 1)'
  }
  wait_until "the replicas to stream on timeline $timeline" 3600 settled
  say "replicas streaming on timeline $timeline"
fi

# 4. The inventory's own fix-up, then the service.
floor=()
[ -n "$fence_floor" ] && floor=(--fence-floor "$fence_floor")
compose run --rm --no-deps -T migrate after-restore --target "$target" "${floor[@]}"
compose up -d --no-deps "${services[@]}" >/dev/null
say "service processes started: ${services[*]}"
say "restored to $target in $(( $(date +%s) - started )) s (timeline $timeline)"
