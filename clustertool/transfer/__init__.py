"""Getting data onto every node: manifests, plans, pipelined chain, rsync fan-out, S3."""
