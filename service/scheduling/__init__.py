"""Placing work: the one definition of a free GPU, capacity questions, GPU pools, place(), allocations and the reasons a node is refused."""
