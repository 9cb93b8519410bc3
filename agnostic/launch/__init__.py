"""Starting and joining the processes of a multi-process strategy."""
