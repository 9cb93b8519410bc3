"""Where rank 0's engine listens (torch's store, JAX's coordinator): on the
job's own address, never on every interface.

The coordinator's name is resolved here and rank 0 listens on the first of
its addresses that belongs to this machine (127.0.0.1 stays loopback); when
none does (a name that resolves to a service address in front of the
machine), on this machine's address on the route to it.
AGNOSTIC_LISTEN_ADDR chooses the address instead (0.0.0.0 or :: for every
interface, only on a network you trust); `agnostic launch` sets it from its
--listen-addr.
"""
import dataclasses
import ipaddress
import logging
import os
import select
import socket
import time
from typing import Optional

from agnostic import errors

LISTEN_VARIABLE = "AGNOSTIC_LISTEN_ADDR"
logger = logging.getLogger("agnostic")


@dataclasses.dataclass(frozen=True)
class Named:
    """An address to listen on as the user named it, for the choice and the
    messages: `who` listens ("Rank 0"), at the coordinator `host` named by
    `host_name` (a variable, or an option of the command line), unless
    `listen` (named by `listen_name`) chooses the address; `route`: a name of
    no address of this machine (a service address in front of it) is
    listened for on this machine's address on the route to it."""
    who: str
    host: str
    host_name: str
    listen: Optional[str] = None
    listen_name: str = LISTEN_VARIABLE
    port_fix: str = "Choose a free one, e.g. with MASTER_PORT."
    route: bool = True

    @property
    def received(self):
        said = [_as_given(self.host_name, self.host)]
        if self.listen:
            said.append(_as_given(self.listen_name, self.listen))
        return ", ".join(said)


def _as_given(name, value):
    """`--option value` for an option of the command line, else `NAME=value`."""
    return f"{name} {value}" if name.startswith("-") else f"{name}={value}"


def rank_0(group):
    """How rank 0 of `group` (a cluster.Environment) names the address its
    engine listens on (torch's store, JAX's coordinator)."""
    name = {"kubeflow-jaxjob": "COORDINATOR_ADDRESS", "agnostic": "the launcher's address",
            "slurm": "the first node of SLURM_JOB_NODELIST"}.get(group.name, "MASTER_ADDR")
    return Named("Rank 0", group.coordinator, name,
                 os.environ.get(LISTEN_VARIABLE, "").strip() or None)


def local_address(named):
    """The address of this machine to listen on for `named` (a `Named`), as
    text; LaunchError saying why there is none."""
    wanted = named.listen.strip("[]") if named.listen else named.host
    try:
        found = socket.getaddrinfo(wanted, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise errors.LaunchError(
            f"{named.who} cannot resolve {wanted!r} ({error}), the address it would "
            f"listen on. Expected this machine's name or address, reachable from every "
            f"process of the job. Received: {named.received}") from error
    addresses = []
    for _, _, _, _, address in found:
        if address[0] not in addresses:
            addresses.append(address[0])
            if held(address[0], 0) is None:
                if not named.listen and is_loopback(address[0]) and \
                        not _names_loopback(named.host):
                    logger.warning(
                        "agnostic: %s is %s on this machine, a loopback address: only "
                        "this machine's processes can reach %s there. Give the address "
                        "the other machines reach, or %s.", named.received, address[0],
                        named.who.lower(), named.listen_name)
                return address[0]
    route = _route_to(addresses[0]) if named.route and addresses and not named.listen \
        else None
    if route is None or held(route, 0) is not None:
        raise errors.LaunchError(
            f"{named.who} cannot listen on {wanted} ({', '.join(addresses)}): not an "
            f"address of this machine. Start {named.who.lower()} on the machine at "
            f"{named.host}, or choose with {named.listen_name} this machine's address "
            "that the others reach (0.0.0.0 listens on every interface: only on a "
            f"network you trust). Received: {named.received}")
    return route


def bound(address, port, listen=True):
    """A TCP socket bound to `address` (text, or a sockaddr tuple) and
    `port`, listening unless `listen` is False; the OSError of the bind as
    it is. Every listener agnostic opens, and every probe of a port, is made
    here: SO_REUSEADDR, so that a port lingering after a closed connection
    (TIME_WAIT) is free, as it is for the engines' own listeners."""
    where = address if isinstance(address, tuple) else (address, port)
    family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(where)
        if listen:
            listener.listen(1024)
    except OSError:
        listener.close()
        raise
    return listener


def listen_socket(named, port):
    """A listening TCP socket on port `port` of this machine's address for
    `named` (a `Named`): the one place agnostic chooses where to listen."""
    address = local_address(named)
    try:
        return bound(address, port)
    except OSError as error:
        raise errors.LaunchError(
            f"{named.who} cannot listen on port {port} at {address} ({error}): the port "
            f"is in use or not allowed. {named.port_fix} Received: {named.received}, "
            f"port {port}") from error


def held(address, port):
    """Why another process holds `port` on this machine's `address` (the
    error binding it gave), or None when it is free. A port that only
    lingers after a closed connection (TIME_WAIT) counts as free, as it does
    for the engines' listeners."""
    try:
        bound(address, port, listen=False).close()
    except OSError as error:
        return error
    return None


def host_port(address, port):
    """HOST:PORT, an IPv6 address in brackets: [::1]:29500."""
    bare = ":" in address and not address.startswith("[")
    return f"[{address}]:{port}" if bare else f"{address}:{port}"


def is_loopback(address):
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


def _names_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _route_to(address):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect((address, 9))  # no packet is sent
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def resolved(addresses):
    """[(label, (family, sockaddr))] for HOST:PORT texts: resolved now, so
    that `unreachable` needs no name lookup (it runs in a forked child)."""
    found = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                host.strip("[]"), int(port), 0, socket.SOCK_STREAM)[0]
        except (OSError, ValueError, IndexError):
            family, sockaddr = None, None
        found.append((address, family, sockaddr))
    return found


def unreachable(resolved_addresses, seconds=1.5):
    """The labels of those `resolved` addresses where nothing accepts a TCP
    connection within `seconds` (all probed at once)."""
    pending, missing = {}, []
    for label, family, sockaddr in resolved_addresses:
        if family is None:
            missing.append(label)
            continue
        probe = socket.socket(family, socket.SOCK_STREAM)
        probe.setblocking(False)
        if probe.connect_ex(sockaddr) in (0,):
            probe.close()
            continue
        pending[probe] = label
    deadline = time.monotonic() + seconds
    try:
        waiting = dict(pending)
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(waiting), [],
                                           max(0.0, deadline - time.monotonic()))
            for probe in writable:
                if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    missing.append(waiting[probe])
                del waiting[probe]
        missing += waiting.values()
    finally:
        for probe in pending:
            probe.close()
    order = [label for label, _, _ in resolved_addresses]
    return sorted(missing, key=order.index)
