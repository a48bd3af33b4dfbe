"""The nodes and what they report: registration, heartbeats, liveness, hardware, GPU health and cordons, topology, and reading nodes back."""
