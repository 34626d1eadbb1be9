"""`clustertool bench`: scaling of a training job across cluster sizes (scaling, launch, chart)
and the plugin's allreduce against Open MPI's (allreduce)."""
