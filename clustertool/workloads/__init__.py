"""Workloads shipped with clustertool (plain scripts, run on the nodes by mpirun)."""
