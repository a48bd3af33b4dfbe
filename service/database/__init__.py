"""The database underneath: the engine, connections and transactions, DATABASE_URL, start-up waits, faults, migrations, the embedded server."""
