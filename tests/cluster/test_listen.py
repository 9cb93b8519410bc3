"""agnostic/cluster/listen.py on real sockets: whether a port of this
machine is held by another process, as JAX's coordinator would find it."""
import socket

from agnostic.cluster import listen


def test_a_free_port_is_free_and_a_listened_one_is_held():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        assert listen.held("127.0.0.1", port) is not None  # bound, not listening yet
        holder.listen()
        error = listen.held("127.0.0.1", port)
        assert isinstance(error, OSError) and "Address already in use" in str(error)
    assert listen.held("127.0.0.1", port) is None  # closed: free again


def test_a_port_left_by_a_closed_connection_is_free():
    # The server side of a connection it closed first lingers in TIME_WAIT:
    # JAX's listener (SO_REUSEADDR) can take it, so it is not held.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's end closes first: TIME_WAIT on `port`
        client.close()
    assert listen.held("127.0.0.1", port) is None
