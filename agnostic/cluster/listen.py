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
import ipaddress
import logging
import os
import select
import socket
import time

from agnostic import errors

LISTEN_VARIABLE = "AGNOSTIC_LISTEN_ADDR"
logger = logging.getLogger("agnostic")


def local_address(host, variable):
    """The address of this machine to listen on for the coordinator `host`
    (named by the environment variable `variable`), as text."""
    chosen = os.environ.get(LISTEN_VARIABLE, "").strip()
    if chosen:
        host, variable = chosen.strip("[]"), LISTEN_VARIABLE
    try:
        found = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise errors.LaunchError(
            f"Rank 0 cannot resolve the coordinator's address {host!r} ({error}), where "
            f"it would listen. Expected this machine's name or address. Received: "
            f"{variable}={host}") from error
    addresses = []
    for _, _, _, _, address in found:
        if address[0] not in addresses:
            addresses.append(address[0])
            if held(address[0], 0) is None:
                if not chosen and is_loopback(address[0]) and not _names_loopback(host):
                    logger.warning(
                        "agnostic: the coordinator %s (%s) is %s on this machine, a loopback "
                        "address: only this machine's processes can join there. Set %s to "
                        "the address the other machines reach.", host, variable,
                        address[0], variable)
                return address[0]
    if chosen:
        raise errors.LaunchError(
            f"{LISTEN_VARIABLE} must be an address of this machine (rank 0's), or 0.0.0.0 "
            f"for every interface. Received: {LISTEN_VARIABLE}={chosen}")
    route = _route_to(addresses[0]) if addresses else None
    if route is None or held(route, 0) is not None:
        raise errors.LaunchError(
            f"Rank 0 cannot listen at the coordinator's address {host} "
            f"({', '.join(addresses)}): not an address of this machine. Start rank 0 "
            f"on {host}, or set {LISTEN_VARIABLE} to this machine's address. Received: "
            f"{variable}={host}")
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


def listen_socket(host, port, variable):
    """A listening TCP socket on this machine's address for `host`."""
    address = local_address(host, variable)
    try:
        listener = bound(address, port)
    except OSError as error:
        raise errors.LaunchError(
            f"Rank 0 cannot listen on {address}:{port} ({error}): the port is taken or "
            f"not allowed. Choose a free one, e.g. with MASTER_PORT. Received: "
            f"{variable}={host}, port {port}") from error
    return listener


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
