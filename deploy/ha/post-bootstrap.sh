#!/bin/sh
# Patroni's bootstrap.post_bootstrap: run once, on the member that initialised the
# cluster, with a superuser connection URL as $1. Creates the service's role and
# database (the role's password from POSTGRES_PASSWORD, as in docker-compose.yml).
# Also run after a restore (deploy/restore.sh), where both exist already: the role
# then gets the password of .env as it is now, and the database is left as restored.
set -eu
[ -n "${POSTGRES_PASSWORD:-}" ] || { echo "post-bootstrap: POSTGRES_PASSWORD is not set" >&2; exit 1; }
psql "$1" -v ON_ERROR_STOP=1 -v password="$POSTGRES_PASSWORD" <<'SQL'
SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'llmgw')
            THEN 'ALTER ROLE llmgw LOGIN PASSWORD ' || quote_literal(:'password')
            ELSE 'CREATE ROLE llmgw LOGIN PASSWORD ' || quote_literal(:'password') END
\gexec
SELECT 'CREATE DATABASE llmgw OWNER llmgw'
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'llmgw')
\gexec
SQL
echo "post-bootstrap: role and database llmgw ready"
