"""Nothing a user trained is lost: atomic, single-writer checkpoint files.

Keras writes `save` and `save_weights` in place, so a kill in the middle of a
write destroys the previous file. On the models agnostic returns, both write
to a temporary file in the same folder, flush it to disk and rename it over
the target (atomic on POSIX), and only the chief process writes at all.
"""
import functools
import hashlib
import json
import os
import re
import secrets
import socket
import threading
import time
import zipfile
from typing import TYPE_CHECKING, Any, Union

from agnostic import errors

if TYPE_CHECKING:  # for type checkers only: importing agnostic imports no engine
    import keras

# A writer's temporary file: its host, process and thread, and a random part,
# so that no two writers, here or on other machines sharing the folder, ever
# use the same name; the target's name last, whose ending Keras reads.
TEMPORARY = ".agnostic-{host}-{pid}-{thread}-{token}-{name}"
# A temporary file of another machine whose writer cannot be asked is a
# left-over only when nothing has written to it for this long.
STALE_SECONDS = 24 * 3600


def _is_local(path):
    return isinstance(path, (str, os.PathLike)) and "://" not in str(path)


def _fsync(path):
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_folder(folder):
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@functools.lru_cache(maxsize=None)
def _host():
    """This machine, as its process ids are seen: the host name and the pid
    namespace (containers sharing a host name have their own), hashed short."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()} {namespace}".encode()).hexdigest()[:8]


def _temporary(folder, name):
    return os.path.join(folder, TEMPORARY.format(
        host=_host(), pid=os.getpid(), thread=threading.get_native_id(),
        token=secrets.token_hex(4), name=name))


def _writer_gone(host, pid, thread):
    """Whether the writer of a temporary file provably no longer writes."""
    if host != _host():
        return False
    if pid == os.getpid():
        return thread not in {t.native_id for t in threading.enumerate()}
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _remove_left_overs(folder, name):
    """Removes the temporary files of `name` that no writer will finish: those
    of dead writers on this machine, and any untouched for STALE_SECONDS."""
    pattern = re.compile(r"\.agnostic-([0-9a-f]{8})-(\d+)-(\d+)-[0-9a-f]{8}-" + re.escape(name) + "$")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for other in names:
        found = pattern.match(other)
        if not found:
            continue
        path = os.path.join(folder, other)
        try:
            old = time.time() - os.stat(path).st_mtime > STALE_SECONDS
            if old or _writer_gone(found.group(1), int(found.group(2)), int(found.group(3))):
                os.remove(path)
        except OSError:  # removed meanwhile by its writer, or not ours to remove
            pass


def replace_atomically(path, write):
    """Calls write(temporary_path), then renames the result over `path`.

    The temporary name is this writer's own and keeps `path`'s ending, which
    Keras reads the format from. Left-overs of writes that were killed are
    removed first; others' writes in progress are left alone, and the last
    rename wins. A write that fails (a full disk) removes its temporary file,
    leaves the previous `path` as it was, and raises CheckpointError.
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    _remove_left_overs(folder, name)
    temporary = _temporary(folder, name)
    try:
        result = write(temporary)
        _fsync(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        try:
            os.remove(temporary)
        except OSError:
            pass
        # h5py reports a failed flush (a full disk) as a RuntimeError.
        if isinstance(error, (OSError, RuntimeError)) \
                and not isinstance(error, errors.CheckpointError):
            raise errors.CheckpointError(
                f"Could not write {path}: {error}. The previous {path}, if any, is "
                "unchanged. Free space on its disk (or fix the cause) and save again."
            ) from error
        raise
    _fsync_folder(folder)
    return result


def atomic(save):
    """Wraps a model's `save` or `save_weights` to write atomically; an HDF5
    file is sealed (`seal`) before it takes its name."""

    @functools.wraps(save)
    def run(filepath, *args, **kwargs):
        overwrite = kwargs.get("overwrite", args[0] if args else True)
        if (not _is_local(filepath) or kwargs.get("max_shard_size")
                or (not overwrite and os.path.exists(filepath))):
            return save(filepath, *args, **kwargs)  # Keras's own handling

        def write(temporary):
            result = save(temporary, *args, **kwargs)
            if os.fspath(filepath).endswith(".h5"):
                seal(temporary)
            return result

        return replace_atomically(filepath, write)

    return run


# An HDF5 file's own record of its data, which check_file verifies: its
# structure alone (what h5py reads) holds no checksum of the numbers.
SEAL = "agnostic_sha256"


def seal(path):
    """Records in the HDF5 file at `path` the SHA-256 of its datasets."""
    import h5py

    with h5py.File(path, "r+") as handle:
        handle.attrs[SEAL] = _data_digest(handle)


def _data_digest(handle):
    """The SHA-256 of every dataset's name and bytes, in the file's order."""
    import h5py
    import numpy

    hashed = hashlib.sha256()

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            data = numpy.asarray(item[()])
            hashed.update(name.encode())
            hashed.update(repr(data.tolist()).encode() if data.dtype.kind == "O"
                          else data.tobytes())

    handle.visititems(visit)
    return hashed.hexdigest()


def digest(path):
    """{"sha256": hex, "size": bytes} of the file at `path`, read from disk."""
    hashed, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            hashed.update(chunk)
            size += len(chunk)
    return {"sha256": hashed.hexdigest(), "size": size}


def check_file(path):
    """Raises CheckpointError unless `path` is a complete checkpoint file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise errors.CheckpointError(f"Checkpoint file {path} does not exist.")
    try:
        if zipfile.is_zipfile(path) or path.endswith(".keras"):
            with zipfile.ZipFile(path) as archive:
                broken = archive.testzip()
            if broken is not None:
                raise ValueError(f"member {broken} fails its checksum")
        elif path.endswith(".h5"):
            import h5py

            with h5py.File(path, "r") as handle:
                list(handle.keys())
                sealed = handle.attrs.get(SEAL)
                if isinstance(sealed, bytes):
                    sealed = sealed.decode()
                if sealed is not None and _data_digest(handle) != sealed:
                    raise ValueError("its data are not the data written: their SHA-256 "
                                     "differs from the one agnostic sealed in it")
        elif path.endswith(".json"):
            with open(path) as handle:
                json.load(handle)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise errors.CheckpointError(
            f"Checkpoint file {path} is truncated or corrupt and was not loaded "
            f"({type(error).__name__}: {error}). Load an earlier checkpoint; "
            "files written through agnostic are replaced whole, so the one "
            "before this is intact."
        ) from error


def checked_load(load):
    """Wraps `load_weights` to name the file when it is not a checkpoint."""

    @functools.wraps(load)
    def run(filepath, *args, **kwargs):
        if _is_local(filepath):
            check_file(filepath)
        return load(filepath, *args, **kwargs)

    return run


def load_model(filepath: Union[str, "os.PathLike[str]"], *args: Any,
               **kwargs: Any) -> "keras.Model":
    """`keras.models.load_model`, with a clear error for a broken file.

    Example:
        >>> model = agnostic.load_model("best.keras")
    """
    import keras

    check_file(filepath)
    return keras.models.load_model(filepath, *args, **kwargs)
