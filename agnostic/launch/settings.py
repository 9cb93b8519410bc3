"""What `agnostic launch` was asked, checked before anything starts: the
number of processes (or `auto`), the nodes, the master's address and port
(IPv6 in brackets: [::1]:29500), torchrun's rendezvous flags, restarts,
where the output goes, and the script or module to run."""
import dataclasses
import importlib
import importlib.util
import os
import sys

from agnostic import cluster, devices, errors
from agnostic.launch import output as output_lib
from agnostic.launch.address import (  # noqa: F401 (free_master_port, parse_master: here too)
    DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, free_master_port, master_address, parse_master,
    show, standalone_master)

DEFAULT_RUN_ID = "none"  # torchrun's --rdzv-id
# torchrun's static rendezvous and its c10d store both mean ours: node 0's
# launcher at the master address (--master, --rdzv-endpoint).
RDZV_BACKENDS = ("static", "c10d")
AUTO = ("auto: for torch one process per CUDA GPU (without GPUs, AGNOSTIC_CPU_DEVICES "
        "when set, else 1); for TensorFlow and JAX 1, as one process uses every "
        "device of its node")


@dataclasses.dataclass(frozen=True)
class Settings:
    """One node's launch, checked: plain numbers and node 0's address."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    host: str = DEFAULT_MASTER_ADDR  # an IPv6 address without brackets
    port: int = DEFAULT_MASTER_PORT
    max_restarts: int = 0
    run_id: str = DEFAULT_RUN_ID
    output: output_lib.Output = output_lib.Output()


def settings(nproc_per_node="1", nnodes="1", node_rank="0", master=None,
             master_addr=None, master_port=None, standalone=False, rdzv_endpoint=None,
             rdzv_backend=None, rdzv_id=None, max_restarts=None, log_dir=None, tee=None,
             local_ranks_filter=None):
    """Checks the command line's values (strings, as typed, or ints) before
    any work; raises `LaunchError` naming the flag and what it received.

    Example: `settings("2", master_addr="10.0.0.1")` is
    `Settings(nproc=2, nnodes=1, node_rank=0, host="10.0.0.1", port=29500)`.
    """
    nproc = _nproc(nproc_per_node)
    nnodes = _nnodes(nnodes)
    rank = _whole_number("--node-rank", node_rank)
    _check_node_rank(nnodes, rank)
    _check_backend(rdzv_backend)
    if standalone:
        host, port = standalone_master(nnodes, master, master_addr, master_port, rdzv_endpoint)
    else:
        host, port = master_address(master, master_addr, master_port, rdzv_endpoint)
    restarts = _restarts(max_restarts, nnodes)
    chosen = output_lib.Output(
        log_dir=output_lib.check_log_dir(log_dir) if log_dir is not None else None,
        tee=output_lib.parse_tee(tee) if tee is not None else 0,
        local_ranks=(output_lib.parse_local_ranks(local_ranks_filter, nproc)
                     if local_ranks_filter is not None else None))
    return Settings(nproc, nnodes, rank, host, port, restarts, _run_id(rdzv_id), chosen)


def _nnodes(value):
    """--nnodes N, or torchrun's MIN:MAX when both are N (not elastic)."""
    low, colon, high = (part.strip() for part in str(value).partition(":"))
    if colon and low != high and low.isdigit() and high.isdigit():
        raise errors.LaunchError(
            f"--nnodes {value} asks for an elastic number of nodes (MIN:MAX), which "
            "agnostic launch does not support: every node must be there from the start. "
            f"Give one number, such as --nnodes {high}.")
    return _whole_number("--nnodes", low if colon and low == high else value, minimum=1)


def _check_backend(backend):
    if backend is not None and str(backend).strip().lower() not in RDZV_BACKENDS:
        raise errors.LaunchError(
            f"--rdzv-backend {backend} is not supported: agnostic launch meets the "
            "nodes itself, node 0's launcher listening at the master address "
            "(--master or --rdzv-endpoint HOST:PORT). Use --rdzv-backend static or "
            f"c10d (both mean that), or leave it out. Received: --rdzv-backend "
            f"{show(backend)}")


def _run_id(value):
    if value is None:
        return DEFAULT_RUN_ID
    text = str(value).strip()
    if not text or "/" in text or text in (".", "..") or "\0" in text:
        raise errors.LaunchError(
            "--rdzv-id must be a name for the run, such as --rdzv-id job42 (it names "
            "the run's folder under --log-dir), without '/'. "
            f"Received: --rdzv-id {show(value)}")
    return text


def _restarts(value, nnodes):
    restarts = _whole_number("--max-restarts", value if value is not None else 0, minimum=0)
    if restarts and nnodes > 1:
        raise errors.LaunchError(
            f"--max-restarts {restarts} restarts the processes of one node, but "
            f"--nnodes {nnodes} asks for {nnodes}: restarts are supported on one node "
            "only. Drop --max-restarts with several nodes (a rerun of every node resumes "
            "from the script's BackupAndRestore backup), or run on one node.")
    return restarts


def _whole_number(flag, value, minimum=None, alternative=""):
    number = cluster.whole(value, minimum)
    if number is None:
        at_least = f", at least {minimum}" if minimum is not None else ""
        raise errors.LaunchError(f"{flag} must be a whole number{at_least}{alternative}. "
                                 f"Received: {flag} {show(value)}")
    return number


def _nproc(value):
    if str(value).strip().lower() == "auto":
        return auto_nproc()
    return _whole_number("--nproc-per-node", value, minimum=1, alternative=(
        ", or auto (one per CUDA GPU for torch, 1 for TensorFlow and JAX)"))


def auto_nproc(environ=None):
    """`--nproc-per-node auto`: the processes this node runs for the engine
    Keras will pick (read without importing Keras; torch imported only for torch)."""
    environ = os.environ if environ is None else environ
    if devices.configured_backend(environ) != "torch":
        return 1  # one TensorFlow worker or JAX process drives every device of its node
    try:
        torch = importlib.import_module("torch")
    except ImportError as error:
        raise errors.LaunchError(
            "--nproc-per-node auto counts torch's CUDA GPUs, but torch cannot be "
            f"imported by this Python ({error}). Install torch here, or give the "
            "number of processes, such as --nproc-per-node 4."
        ) from error
    try:
        cpus = devices.requested_cpu_devices(environ)
    except errors.DeviceRequestError as error:
        raise errors.LaunchError(f"--nproc-per-node auto: {error}") from error
    return torch.cuda.device_count() or cpus or 1


def _check_node_rank(nnodes, node_rank):
    if not 0 <= node_rank < nnodes:
        raise errors.LaunchError(
            f"--node-rank {node_rank} is out of range for --nnodes {nnodes}: "
            f"use 0 to {nnodes - 1}, node 0 being the one at --master-addr."
        )


def check_command(command):
    """Refuses a missing script or module before anything starts: otherwise
    the typo would show in every process, after every node has joined."""
    if not command or command[0] == "-m" and len(command) < 2:
        raise errors.LaunchError("agnostic launch needs a script: agnostic launch "
                                 "--nproc-per-node N train.py [args...], or "
                                 "-m package.module [args...]")
    if command[0] == "-m":
        _check_module(command[1])
    elif not os.path.exists(command[0]):
        raise errors.LaunchError(
            f"The script {command[0]!r} does not exist (relative to {os.getcwd()}). "
            "Expected the Python file every process runs, such as train.py, or -m and "
            "a module name. Check the path, or run from the script's folder."
        )


def _check_module(name):
    try:
        spec, reason = _find_module(name), ""
    except (ImportError, ValueError) as error:
        spec, reason = None, f" ({error})"
    if spec is None:
        raise errors.LaunchError(
            f"-m {name}: no module {name!r} to run was found from {os.getcwd()} or "
            f"sys.path{reason}. Expected what `python -m {name}` runs: a module, or a "
            "package with __main__.py, such as -m mypkg.train. Run from the folder "
            "that holds the package, or add that folder to PYTHONPATH."
        )


def _find_module(name):
    # As `python -m`, which each process runs, search the current folder first.
    # Finding a submodule imports its parent packages, as `python -m` does.
    folder = os.getcwd()
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(name + ".__main__")
        return spec
    finally:
        sys.path.remove(folder)
