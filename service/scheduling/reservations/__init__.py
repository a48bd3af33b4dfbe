"""Reservations (issue 47): room for `count` replicas of a shape set aside for a tenant's window.

docs/scheduler/reservations.md is the model as schedulers and operators read
it. Where each rule lives:

- who may use a GPU set aside: service/scheduling/availability.py
  (gpu_admitted), read by every claim under its nodes' locks;
- ../reservation_admission.py: whether a place may be placed into a reservation, or with
  `until` (checked by place() before it looks);
- reserving.py: reserve() (the GPUs chosen by place itself), ending one
  (releaseReservation, its end, idle);
- transitions.py: the changes on time, run by service/scheduling/timeline/;
- records.py: a reservation read back.

Counted toward the tenant's limit from creation: tenancy_reserved
(migration 0024), read by tenancy_claim.
"""

from service.scheduling.reservation_admission import ReservationForbidden
from service.scheduling.reservations.records import (
    Reservation,
    ReservedGpus,
    get_reservation,
    list_reservations,
)
from service.scheduling.reservations.reserving import (
    ReservationConflict,
    ReservationNotFound,
    ReservationSpec,
    release_reservation,
    reserve,
)
from service.scheduling.reservations.transitions import TRANSITIONS

__all__ = [
    "TRANSITIONS",
    "Reservation",
    "ReservationConflict",
    "ReservationForbidden",
    "ReservationNotFound",
    "ReservationSpec",
    "ReservedGpus",
    "get_reservation",
    "list_reservations",
    "release_reservation",
    "reserve",
]
