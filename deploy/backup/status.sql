-- What the backup schedule (deploy/backup/llmgw_backup.py) last saw of the pgBackRest
-- repository, one row, written on the primary every LLMGW_BACKUP_CHECK_EVERY seconds.
-- The service reads it (service/backup_status.py) for /metrics and /readyz; it is the
-- backup machinery's report, in a schema of its own, not the inventory's schema (no
-- migration owns it). Idempotent: run before every first write of a process.
CREATE SCHEMA IF NOT EXISTS backups;
CREATE TABLE IF NOT EXISTS backups.status (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    -- When the schedule last looked at the repository (a stale value: the schedule is not
    -- running, or no member is primary).
    checked_at timestamptz NOT NULL,
    -- false: the repository could not be read at checked_at (unreachable, corrupt, wrong
    -- key); the columns below then keep what it held when it last could.
    repository_readable boolean NOT NULL,
    last_backup_at timestamptz,
    last_backup_type text,
    last_backup_label text,
    last_full_at timestamptz,
    oldest_restorable_at timestamptz,
    backups integer NOT NULL DEFAULT 0,
    repository_bytes bigint,
    last_attempt_at timestamptz,
    last_attempt_ok boolean,
    last_error text,
    member text
);
DO $$
BEGIN
    -- The service's role reads it (the single-node demo's superuser is that role).
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'llmgw') THEN
        GRANT USAGE ON SCHEMA backups TO llmgw;
        GRANT SELECT ON backups.status TO llmgw;
    END IF;
END $$;
