#!/bin/sh
# Patroni's bootstrap.post_bootstrap: run once, on the member that initialised the
# cluster, with a superuser connection URL as $1. Creates the service's role and
# database (the role's password from POSTGRES_PASSWORD, as in docker-compose.yml).
set -eu
[ -n "${POSTGRES_PASSWORD:-}" ] || { echo "post-bootstrap: POSTGRES_PASSWORD is not set" >&2; exit 1; }
psql "$1" -v ON_ERROR_STOP=1 -v password="$POSTGRES_PASSWORD" <<'SQL'
CREATE ROLE llmgw LOGIN PASSWORD :'password';
CREATE DATABASE llmgw OWNER llmgw;
SQL
echo "post-bootstrap: created role and database llmgw"
