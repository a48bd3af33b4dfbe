"""Tenancy (issue 46): who a replica is charged to, how much each tenant may hold, what protects a deployment.

A tenant is a team or an environment sharing the fleet. Per GPU class it may
have a quota: `guaranteed` GPUs it can always get back, and a `limit` it
never exceeds (borrowed GPUs included; none: no limit). Every allocation
belongs to a tenant ("default" when the caller names none) and records its
priority, its deployment and whether it was borrowed (held beyond the
guarantee). docs/scheduler/tenancy.md is the model as schedulers and
operators read it.

Where each rule lives, by idea:

- charges.py: a charge (tenant, priority, deployment) as asked, its checks
  without the database, and a scheduler token's binding to its tenant.
- quota_claims.py: the limit, checked in the statement that claims the GPUs
  (allocations/storing.store_statement), from every process, exactly; and the
  definition of `borrowed`.
- tenants.py: setTenant, removeTenant, the tenants and their usage.
- budgets.py: disruption budgets.
- headroom.py: what a read (fit, explainPlacement, an Unplaceable answer)
  learns of a tenant's room under its limit, without locking anything.
- victims.py: which replicas a place may stop to make room (preemption), the
  order of victim sets, the record the answers list, and the count of them.
- budgets_locked.py: the budgets and quota rows preemption reads, and locks in
  the claim's lock order.

Kept light on purpose: this package's modules are imported by the claim path
(storing.py, verdicts.py), so none of them imports placement or the GraphQL
layer.
"""
