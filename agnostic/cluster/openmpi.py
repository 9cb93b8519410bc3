"""Open MPI's `mpirun`: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.

It names no coordinator. On one node the processes meet on 127.0.0.1; on
several, at the host `mpirun` runs on (from its URI, as JAX's own Open MPI
support does), which must then run rank 0: the usual case inside a batch
job. MASTER_ADDR and MASTER_PORT choose them instead.
"""
import re

from agnostic import cluster, errors

LAUNCHER_URI = "OMPI_MCA_orte_hnp_uri"


def detect(environ):
    if "OMPI_COMM_WORLD_SIZE" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(
        environ, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
    if world_size < 2:
        return None
    local_size = cluster.whole_number(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", default=1, least=1)
    one_node = local_size == world_size
    uri = environ.get(LAUNCHER_URI, "")
    coordinator = cluster.text(environ, "MASTER_ADDR") if "MASTER_ADDR" in environ else (
        "127.0.0.1" if one_node else launcher_host(uri))
    if coordinator is None:
        raise errors.LaunchError(
            f"This Open MPI job spans several nodes ({world_size} processes, {local_size} "
            f"on this one), and mpirun's address could not be read from {LAUNCHER_URI}. "
            f"Received: {LAUNCHER_URI}={uri!r}. Set MASTER_ADDR (rank 0's host) and "
            "MASTER_PORT with mpirun -x.")
    local_rank = cluster.whole_number(environ, "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    if "OMPI_COMM_WORLD_LOCAL_SIZE" in environ:
        cluster.check_rank("OMPI_COMM_WORLD_LOCAL_RANK", local_rank, local_size)
    return cluster.Environment(
        "openmpi", world_size, rank, local_rank=local_rank,
        # (OMPI_COMM_WORLD_NODE_RANK counts processes on the node, not nodes.)
        node_rank=rank // local_size,
        coordinator=coordinator, port=_port(environ, uri),
        local_world_size=local_size,
        hosts=(coordinator,) * world_size if one_node else None,
    )


def launcher_host(uri):
    """The first address in mpirun's URI, "1234.0;tcp://10.0.0.1,10.1.0.1:4567"."""
    found = re.search(r"tcp://([^,:;]+)", uri)
    return found.group(1) if found else None


def _port(environ, uri):
    job = uri.split(".")[0]  # the job family: the same in every process
    return cluster.job_port(environ, int(job) if job.isdigit() else 0)
