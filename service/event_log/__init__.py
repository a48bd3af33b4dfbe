"""The event log: every change recorded with who and why, announced after commit, streamed to subscribers."""
