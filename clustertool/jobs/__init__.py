"""Jobs: mpirun argv, detached launch, logs, kill, housekeeping."""
