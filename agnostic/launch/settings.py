"""What `agnostic launch` was asked, checked before anything starts: the
number of processes (or `auto`), the nodes, the master's address and port,
and the script or module to run."""
import dataclasses
import importlib
import importlib.util
import os
import shlex
import socket
import sys

from agnostic import devices, errors
from agnostic.launch import local

TORCH_PORT_OFFSET = 1
JAX_PORT_OFFSET = 2
HIGHEST_MASTER_PORT = 65535 - JAX_PORT_OFFSET
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29400
AUTO = ("auto: for torch one process per CUDA GPU (without GPUs, AGNOSTIC_CPU_DEVICES "
        "when set, else 1); for TensorFlow and JAX 1, as one process uses every "
        "device of its node")


@dataclasses.dataclass(frozen=True)
class Settings:
    """One node's launch, checked: plain numbers and node 0's address."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    host: str = DEFAULT_MASTER_ADDR
    port: int = DEFAULT_MASTER_PORT


def settings(nproc_per_node="1", nnodes="1", node_rank="0", master=None,
             master_addr=None, master_port=None, standalone=False):
    """Checks the command line's values (strings, as typed, or ints) before
    any work; raises `LaunchError` naming the flag and what it received.

    Example: `settings("2", master_addr="10.0.0.1")` is
    `Settings(nproc=2, nnodes=1, node_rank=0, host="10.0.0.1", port=29400)`.
    """
    nproc = _nproc(nproc_per_node)
    nnodes = _whole_number("--nnodes", nnodes, minimum=1)
    rank = _whole_number("--node-rank", node_rank)
    _check_node_rank(nnodes, rank)
    if standalone:
        host, port = _standalone(nnodes, master, master_addr, master_port)
    else:
        host, port = master_address(master, master_addr, master_port)
    return Settings(nproc, nnodes, rank, host, port)


def _show(value):
    """A value as it was typed on the command line (an empty one as '')."""
    return shlex.quote(str(value))


def _whole_number(flag, value, minimum=None, alternative=""):
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or (minimum is not None and number < minimum):
        at_least = f", at least {minimum}" if minimum is not None else ""
        raise errors.LaunchError(f"{flag} must be a whole number{at_least}{alternative}. "
                                 f"Received: {flag} {_show(value)}")
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


def parse_master(master):
    host, _, port = (master or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= HIGHEST_MASTER_PORT:
        raise errors.LaunchError(
            "--master must be HOST:PORT, the address of node 0 and a free port "
            f"on it (1 to {HIGHEST_MASTER_PORT}), such as 10.0.0.1:29400. "
            f"Received: --master {master!r}"
        )
    return host, int(port)


def parse_port(flag, value):
    try:
        port = int(str(value).strip())
    except ValueError:
        port = 0
    if not 0 < port <= HIGHEST_MASTER_PORT:
        raise errors.LaunchError(
            f"{flag} must be a free port on node 0, from 1 to {HIGHEST_MASTER_PORT} "
            "(the launcher also uses PORT+1 for torch and PORT+2 for JAX), such as "
            f"{DEFAULT_MASTER_PORT}. Received: {flag} {_show(value)}"
        )
    return port


def master_address(master=None, master_addr=None, master_port=None):
    """(host, port) of node 0, from --master HOST:PORT or --master-addr and
    --master-port; both forms may be given only if they agree."""
    host, port = parse_master(master) if master is not None else (None, None)
    if master_addr is not None and not str(master_addr).strip():
        raise errors.LaunchError("--master-addr must be node 0's host name or address, "
                                 "such as 10.0.0.1. Received: --master-addr ''")
    address = str(master_addr).strip() if master_addr is not None else None
    number = parse_port("--master-port", master_port) if master_port is not None else None
    for flag, alone, within in (("--master-addr", address, host), ("--master-port", number, port)):
        if alone is not None and within is not None and alone != within:
            raise errors.LaunchError(
                f"--master and {flag} name different masters. Give node "
                "0's address one way: --master-addr HOST --master-port PORT, or "
                f"--master HOST:PORT. Received: --master {_show(master)} {flag} {_show(alone)}"
            )
    return (_first(host, address, DEFAULT_MASTER_ADDR),
            _first(port, number, DEFAULT_MASTER_PORT))


def _first(*values):
    return next(value for value in values if value is not None)


def _standalone(nnodes, master, master_addr, master_port):
    if nnodes > 1:
        raise errors.LaunchError(
            f"--standalone runs a single node, but --nnodes {nnodes} asks for {nnodes}. "
            "Drop --standalone and start every node with --master-addr (node 0's "
            "address) and --master-port, or drop --nnodes."
        )
    given = [f"{flag} {_show(value)}" for flag, value in (
        ("--master", master), ("--master-addr", master_addr), ("--master-port", master_port))
        if value is not None]
    if given:
        raise errors.LaunchError(
            "--standalone chooses the master itself (127.0.0.1 and a free port), so "
            f"it takes no master address. Received: --standalone {' '.join(given)}. "
            "Drop --standalone, or the master flags."
        )
    return DEFAULT_MASTER_ADDR, free_master_port()


def free_master_port(attempts=100):
    """A free port P with P+1 (torch's store) and P+2 (JAX's coordinator) free too."""
    for _ in range(attempts):
        port = local.free_port()
        if port <= HIGHEST_MASTER_PORT and all(
                _is_free(port + offset) for offset in (TORCH_PORT_OFFSET, JAX_PORT_OFFSET)):
            return port
    raise errors.LaunchError(
        f"--standalone found no free port P with P+1 and P+2 free too in {attempts} "
        "tries. Drop --standalone and give one: --master-port PORT."
    )


def _is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


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
