"""`clustertool plugin`: build the native NCCL plugin (native/), deploy it to every node (all or
nothing), check it, and the job environment that uses it; remote: the shell lines run on nodes."""
