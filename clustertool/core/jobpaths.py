"""Where jobs live on nodes and how their processes are known: shared by the jobs feature and the
node facts below it (cluster/facts.py), so neither imports the other's layer."""

JOB_ENV = "CLUSTERTOOL_JOB"  # every rank inherits it: the job's marker for kill and facts
JOBS_DIR = ".clustertool/jobs"  # relative to the user's home on every node
RANK_HOST_ENV = "CLUSTERTOOL_RANK_HOST"  # where a rank's Python script host is, relative to the home (rankhost.py)
MPI_COMMS = ("mpirun", "mpiexec", "orterun", "orted", "prted", "prterun", "hydra_pmi_proxy")  # launcher processes
