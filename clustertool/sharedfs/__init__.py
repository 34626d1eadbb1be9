"""Shared filesystems: one folder every node of a cluster sees (EFS, FSx for Lustre, the local sshfs stand-in).

``specs`` parses what the user asked for (``up --shared-fs``, ``shared_fs:`` in a spec file);
``argv`` builds each kind's mount command (a registry the providers' kinds add to); ``mount``
mounts, checks and unmounts them on the nodes. Providers make or attach the filesystems
through ``Provider.shared_fs``.
"""
