"""Nothing a user trained is lost: atomic, single-writer checkpoint files.

Keras writes `save` and `save_weights` in place, so a kill in the middle of a
write destroys the previous file. On the models agnostic returns, both write
to a temporary file in the same folder, flush it to disk and rename it over
the target (atomic on POSIX), and only the chief process writes at all.
"""
import functools
import glob
import json
import os
import zipfile

from agnostic import errors

TEMPORARY = ".agnostic-{pid}-{name}"


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


def replace_atomically(path, write):
    """Calls write(temporary_path), then renames the result over `path`.

    The temporary name keeps `path`'s ending, which Keras reads the format
    from. Left-overs of writes that were killed are removed first.
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    for stale in glob.glob(os.path.join(folder, TEMPORARY.format(pid="*", name=name))):
        try:
            os.remove(stale)
        except OSError:
            pass
    temporary = os.path.join(folder, TEMPORARY.format(pid=os.getpid(), name=name))
    try:
        result = write(temporary)
        _fsync(temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    _fsync_folder(folder)
    return result


def atomic(save):
    """Wraps a model's `save` or `save_weights` to write atomically."""

    @functools.wraps(save)
    def run(filepath, *args, **kwargs):
        overwrite = kwargs.get("overwrite", args[0] if args else True)
        if (not _is_local(filepath) or kwargs.get("max_shard_size")
                or (not overwrite and os.path.exists(filepath))):
            return save(filepath, *args, **kwargs)  # Keras's own handling
        return replace_atomically(filepath, lambda temporary: save(temporary, *args, **kwargs))

    return run


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


def load_model(filepath, *args, **kwargs):
    """`keras.models.load_model`, with a clear error for a broken file.

    Example:
        >>> model = agnostic.load_model("best.keras")
    """
    import keras

    check_file(filepath)
    return keras.models.load_model(filepath, *args, **kwargs)
