"""The job's secret: what the launchers of several nodes prove to each other
before one believes a word of another (see rendezvous.py).

It comes from a file (--secret-file PATH, or AGNOSTIC_JOB_SECRET_FILE=PATH)
that only its owner may read, as ssh wants of a private key, or from the
variable AGNOSTIC_JOB_SECRET itself; in that order. Every node must be given
the same one. A single node opens no channel and needs none.
"""
import os
import stat

from agnostic import errors

VARIABLE = "AGNOSTIC_JOB_SECRET"
FILE_VARIABLE = "AGNOSTIC_JOB_SECRET_FILE"
FLAG = "--secret-file"
SHORTEST = 16  # characters
LONGEST = 4096
MAKE_ONE = ("(umask 077; python -c 'import secrets; print(secrets.token_hex(32))' "
            "> ~/.agnostic-job-secret)")


def for_launch(nnodes, secret_file=None, environ=None):
    """The secret (bytes) of a launch of `nnodes` nodes; None for one node.
    Raises `LaunchError` when several nodes have none, or a bad one."""
    if nnodes == 1:
        return None
    secret = job_secret(secret_file, environ)
    if secret is None:
        raise errors.LaunchError(
            f"--nnodes {nnodes} needs a job secret, the same on every node, so that no "
            "other process can join the job, stop it or pose as node 0. Received: no "
            f"{FLAG}, {FILE_VARIABLE} or {VARIABLE}. Make one on a disk every node "
            f"reads (or copy it to each node): {MAKE_ONE}, then start every node with "
            f"{FLAG} ~/.agnostic-job-secret."
        )
    return secret


def job_secret(secret_file=None, environ=None):
    """The secret given by `secret_file`, else by the variables; None if none."""
    environ = os.environ if environ is None else environ
    if secret_file is not None:
        return _read(secret_file, f"{FLAG} {secret_file}")
    if environ.get(FILE_VARIABLE) is not None:
        path = environ[FILE_VARIABLE]
        return _read(path, f"{FILE_VARIABLE}={path}")
    if environ.get(VARIABLE) is not None:
        return _checked(environ[VARIABLE].strip(), f"{VARIABLE} (not shown)")
    return None


def withheld(environment):
    """`environment` (a dict: a training process's variables) without the
    secret itself: it stays with the launchers, out of reach of the
    training code and of the libraries that record their environment."""
    environment.pop(VARIABLE, None)
    return environment


def _read(path, received):
    path = os.path.expanduser(str(path))
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise errors.LaunchError(
            f"The job's secret file cannot be read ({error.strerror}). Expected a file "
            f"only you can read, holding the secret. Received: {received}"
        ) from error
    status = os.fstat(descriptor)  # of the file opened, not of its name
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise errors.LaunchError(
            f"The job's secret file is not a regular file. Received: {received}")
    with os.fdopen(descriptor, "rb") as handle:
        if status.st_mode & 0o077:
            raise errors.LaunchError(
                f"The job's secret file can be read by other users (mode "
                f"{stat.S_IMODE(status.st_mode):04o}), who could then join or stop the "
                f"job; it must be private, as ssh wants of a key. Fix: chmod 600 {path}. "
                f"Received: {received}"
            )
        if hasattr(os, "getuid") and status.st_uid != os.getuid():
            raise errors.LaunchError(
                f"The job's secret file belongs to user id {status.st_uid}, not to you "
                f"({os.getuid()}); make your own: {MAKE_ONE}. Received: {received}"
            )
        content = handle.read(LONGEST + 1)
    try:
        text = content.decode().strip()
    except UnicodeDecodeError:
        text = None
    if text is None or len(content) > LONGEST:
        raise errors.LaunchError(
            f"The job's secret file must hold one line of text, at most {LONGEST} "
            f"characters, such as 64 random hex digits: {MAKE_ONE}. Received: {received}"
        )
    return _checked(text, received)


def _checked(text, received):
    if len(text) < SHORTEST:
        raise errors.LaunchError(
            f"The job's secret has {len(text)} characters; it needs at least {SHORTEST} "
            f"that nobody could guess, such as 64 random hex digits: {MAKE_ONE}. "
            f"Received: {received}"
        )
    return text.encode()
