"""The signed lines the launchers of one job speak (see rendezvous.py).

Each side of a connection first sends a greeting with a fresh random nonce;
the connection's key is HMAC-SHA256(job secret, both nonces); every later
line is "MAC JSON", the MAC (HMAC-SHA256 with that key) covering the sender's
role, the line's number and the JSON. So a process without the secret can
say nothing that is believed, and a line recorded from one connection means
nothing in another, nor again in the same one. Lines are not encrypted: they
hold addresses and ports.
"""
import hashlib
import hmac
import json
import socket
import time

LINE_LIMIT = 1 << 16  # bytes in a line, unless raised for one that must be longer
GREETING = b"agnostic-launch 1"
NONCE_BYTES = 16
LEADER, MEMBER = b"leader", b"member"


class ChannelError(ConnectionError):
    """A connection said something that is not the channel's, or nothing in time."""


class Lines:
    """The lines a socket receives, each at most `limit` bytes."""

    def __init__(self, connection, limit=LINE_LIMIT):
        self.connection, self.limit = connection, limit
        self.buffer, self.searched = bytearray(), 0

    def fill(self):
        data = self.connection.recv(1 << 16)
        if not data:
            raise ChannelError("the connection was closed")
        self.buffer += data

    def take(self):
        end = self.buffer.find(b"\n", self.searched)
        if end < 0:
            self.searched = len(self.buffer)
            if len(self.buffer) > self.limit:
                raise ChannelError(f"a line longer than {self.limit} bytes")
            return None
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        self.searched = 0
        if len(line) > self.limit:
            raise ChannelError(f"a line longer than {self.limit} bytes")
        return line

    def read(self, deadline):
        while True:
            line = self.take()
            if line is not None:
                return line
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelError("no answer in time")
            self.connection.settimeout(left)
            try:
                self.fill()
            except socket.timeout:
                raise ChannelError("no answer in time") from None


def greeting(nonce):
    return GREETING + b" " + nonce.hex().encode() + b"\n"


def nonce_of(line):
    greeting, _, nonce = line.rpartition(b" ")
    try:
        value = bytes.fromhex(nonce.decode("ascii"))
    except ValueError:  # UnicodeDecodeError too
        value = b""
    if greeting != GREETING or len(value) != NONCE_BYTES:
        raise ChannelError(f"not an agnostic launcher's greeting: {bytes(line[:60])!r}")
    return value


def key(secret, leader_nonce, member_nonce):
    return hmac.new(secret, GREETING + leader_nonce + member_nonce, hashlib.sha256).digest()


def tag(key, role, number, body):
    signed = role + b" " + str(number).encode() + b" " + body
    return hmac.new(key, signed, hashlib.sha256).hexdigest().encode()


class Link:
    """A connection between two launchers of the job, each having proved the
    secret: messages (dicts) both ways, each line signed and numbered."""

    def __init__(self, lines, key, role, peer):
        self.lines, self.key, self.role, self.peer = lines, key, role, peer
        self.other = MEMBER if role == LEADER else LEADER
        self.sent = self.received = 0

    @property
    def connection(self):
        return self.lines.connection

    def fileno(self):
        return self.connection.fileno()

    def close(self):
        self.connection.close()

    def send(self, message):
        body = json.dumps(message).encode()
        signed = tag(self.key, self.role, self.sent, body)
        self.sent += 1
        self.connection.sendall(signed + b" " + body + b"\n")

    def open(self, line):
        """The message a line holds, if its MAC is right."""
        signed, _, body = line.partition(b" ")
        if not hmac.compare_digest(signed, tag(self.key, self.other, self.received, body)):
            raise ChannelError("a line not signed with the job's secret")
        self.received += 1
        try:
            message = json.loads(body.decode())
        except ValueError:
            message = None
        if not isinstance(message, dict):
            raise ChannelError("a signed line that is not a message")
        return message

    def receive(self, deadline):
        return self.open(self.lines.read(deadline))

    def poll(self):
        """The messages that arrived, once select found the connection readable."""
        self.lines.fill()
        messages = []
        line = self.lines.take()
        while line is not None:
            messages.append(self.open(line))
            line = self.lines.take()
        return messages
