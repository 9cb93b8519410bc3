"""Node 0's address: --master HOST:PORT (and torchrun's --rdzv-endpoint),
--master-addr and --master-port, --standalone's free port. An IPv6 address
is written in brackets with its port ([::1]:29500) and kept without them
(::1); whatever builds HOST:PORT from it again uses cluster.listen's
`host_port`."""
import shlex
import socket

from agnostic import errors
from agnostic.cluster import listen
from agnostic.launch import processes

TORCH_PORT_OFFSET = 1
JAX_PORT_OFFSET = 2
HIGHEST_MASTER_PORT = 65535 - JAX_PORT_OFFSET
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torchrun's; the launcher also takes PORT+1 and PORT+2


def show(value):
    """A value as it was typed on the command line (an empty one as '')."""
    return shlex.quote(str(value))


def parse_master(master, flag="--master"):
    """(host, port) from HOST:PORT; an IPv6 address in brackets, [::1]:29500,
    comes back without them."""
    text = str(master or "").strip()
    if text.startswith("["):
        host, closed, port = text[1:].partition("]:")
        host = host if closed and _is_ipv6(host) else ""
    else:
        host, _, port = text.rpartition(":")
        if ":" in host:
            raise errors.LaunchError(
                f"{flag} {master} is ambiguous: an IPv6 address and its port are written "
                f"with the address in brackets, such as {flag} [{host}]:{port}. "
                f"Received: {flag} {show(master)}")
    if not host or not port.isdigit() or not 0 < int(port) <= HIGHEST_MASTER_PORT:
        raise errors.LaunchError(
            f"{flag} must be HOST:PORT, the address of node 0 and a free port "
            f"on it (1 to {HIGHEST_MASTER_PORT}), such as 10.0.0.1:{DEFAULT_MASTER_PORT}, "
            f"or [::1]:{DEFAULT_MASTER_PORT} for an IPv6 address. "
            f"Received: {flag} {master!r}"
        )
    return host, int(port)


def _is_ipv6(host):
    try:
        socket.inet_pton(socket.AF_INET6, host.split("%")[0])
    except (OSError, ValueError):
        return False
    return True


def parse_port(flag, value):
    try:
        port = int(str(value).strip())
    except ValueError:
        port = 0
    if not 0 < port <= HIGHEST_MASTER_PORT:
        raise errors.LaunchError(
            f"{flag} must be a free port on node 0, from 1 to {HIGHEST_MASTER_PORT} "
            "(the launcher also uses PORT+1 for torch and PORT+2 for JAX), such as "
            f"{DEFAULT_MASTER_PORT}. Received: {flag} {show(value)}"
        )
    return port


def _master_addr(value):
    """--master-addr: a host name or address; [::1] comes back as ::1."""
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]") and _is_ipv6(text[1:-1]):
        text = text[1:-1]
    if not text or text.startswith("[") or "]" in text:
        raise errors.LaunchError(
            "--master-addr must be node 0's host name or address, such as 10.0.0.1 or "
            f"::1, without a port (give it with --master-port). Received: --master-addr "
            f"{show(value)}")
    return text


def master_address(master=None, master_addr=None, master_port=None, rdzv_endpoint=None):
    """(host, port) of node 0, from --master HOST:PORT (or torchrun's
    --rdzv-endpoint HOST:PORT), or --master-addr and --master-port; several
    forms may be given only if they agree."""
    named = []  # (flag, as typed, host or None, port or None)
    for flag, value in (("--master", master), ("--rdzv-endpoint", rdzv_endpoint)):
        if value is not None:
            named.append((flag, value) + parse_master(value, flag))
    if master_addr is not None:
        named.append(("--master-addr", master_addr, _master_addr(master_addr), None))
    if master_port is not None:
        named.append(("--master-port", master_port, None,
                      parse_port("--master-port", master_port)))
    for part in (2, 3):  # the host, then the port
        naming = [entry for entry in named if entry[part] is not None]
        for other in naming[1:]:
            if other[part] != naming[0][part]:
                raise errors.LaunchError(
                    f"{naming[0][0]} and {other[0]} name different masters. Give node "
                    "0's address one way: --master-addr HOST --master-port PORT, or "
                    f"--master HOST:PORT. Received: {naming[0][0]} {show(naming[0][1])} "
                    f"{other[0]} {show(other[1])}")
    host = next((entry[2] for entry in named if entry[2] is not None), DEFAULT_MASTER_ADDR)
    port = next((entry[3] for entry in named if entry[3] is not None), DEFAULT_MASTER_PORT)
    return host, port


def standalone_master(nnodes, master, master_addr, master_port, rdzv_endpoint=None):
    if nnodes > 1:
        raise errors.LaunchError(
            f"--standalone runs a single node, but --nnodes {nnodes} asks for {nnodes}. "
            "Drop --standalone and start every node with --master-addr (node 0's "
            "address) and --master-port, or drop --nnodes."
        )
    given = [f"{flag} {show(value)}" for flag, value in (
        ("--master", master), ("--master-addr", master_addr), ("--master-port", master_port),
        ("--rdzv-endpoint", rdzv_endpoint)) if value is not None]
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
        port = processes.free_port()
        offsets = (TORCH_PORT_OFFSET, JAX_PORT_OFFSET)
        if port <= HIGHEST_MASTER_PORT and all(
                listen.held("", port + offset) is None for offset in offsets):
            return port
    raise errors.LaunchError(
        f"--standalone found no free port P with P+1 and P+2 free too in {attempts} "
        "tries. Drop --standalone and give one: --master-port PORT."
    )
