"""The native NCCL plugin's files: build it (native/), deploy it to every node (all or nothing),
the job environment that uses it, and what NCCL's log says about it (nccl_log); remote: the shell
lines run on nodes. Jobs use these; `plugin check`, which runs a job, is doctor/plugin_check.py."""
