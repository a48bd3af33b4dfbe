"""Fleet health that acts: taints, the remediation policy, remediations, validation, drift.

What a GPU's faults mean for placement is service/scheduling/availability.py's
(through the taints); this package decides which taints go where and when
they are lifted.
"""
