"""Maintenance windows (issue 47): booked by operators, drained within disruption budgets, moved on time.

- windows.py: booking (scheduleMaintenance), its checks, reading windows back;
- waves.py: asking a draining window's replicas to move, within budgets;
- transitions.py: SCHEDULED -> DRAINING -> IN_PROGRESS -> DONE on time,
  once, from every process's loop; the windows' taints; cancelling.

Which nodes placement avoids is service/scheduling/maintenance_rule.py's.
"""

from service.fleet.maintenance.transitions import SWEEP, cancel, run_round
from service.fleet.maintenance.windows import (
    MaintenanceConflict,
    MaintenanceSpec,
    WindowRecord,
    list_windows,
    read_window,
    schedule,
)

__all__ = [
    "SWEEP",
    "MaintenanceConflict",
    "MaintenanceSpec",
    "WindowRecord",
    "cancel",
    "list_windows",
    "read_window",
    "run_round",
    "schedule",
]
