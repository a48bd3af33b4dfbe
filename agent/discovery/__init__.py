"""What the agent finds on its node: GPUs (NVML or a file) and their topology, fabrics, RAM,
disks, model weights and their state, engine versions, XIDs, the node's identity.

Each module reads one source (NVML, sysfs, /proc, the model folders) through
the host root (rootfs.py) and returns plain values; agent/report.py puts them
together as the contract's NodeInput.
"""
