"""What `gpus` may be, whatever the machine has: checked before anything is
looked at, with an error naming the value received."""
from agnostic import errors


def whole_numbers(gpus):
    """`gpus` with NumPy's (and any other library's) whole numbers as ints:
    gpus=np.int64(2), or ids from an array, mean what 2 and [0, 1] mean."""
    import operator

    def whole(value):
        if isinstance(value, (bool, int)) or not hasattr(type(value), "__index__"):
            return value
        if type(value).__name__.startswith("bool"):  # NumPy's bool_: refused below
            return value
        return operator.index(value)

    if isinstance(gpus, (list, tuple)):
        return type(gpus)(whole(value) for value in gpus)
    return whole(gpus)


def check_gpus_type(gpus):
    """Rejects values of `gpus` that are wrong whatever the machine has."""
    if gpus is None:
        return
    if isinstance(gpus, bool) or not isinstance(gpus, (int, list, tuple)):
        raise errors.DeviceRequestError(
            "`gpus` must be None (every device), a positive int (that many "
            "devices) or a list of device ids such as [0, 1]. "
            f"Received: gpus={gpus!r} (of type {type(gpus).__name__})"
        )
    if isinstance(gpus, int):
        if gpus < 1:
            raise errors.DeviceRequestError(
                "`gpus` must be at least 1; pass None to use every device. "
                f"Received: gpus={gpus!r}"
            )
        return
    if not gpus:
        raise errors.DeviceRequestError(
            "`gpus` is an empty list: name at least one device id, such as "
            f"[0, 1], or pass None to use every device. Received: gpus={gpus!r}"
        )
    for device_id in gpus:
        if isinstance(device_id, bool) or not isinstance(device_id, int):
            raise errors.DeviceRequestError(
                "Every device id in `gpus` must be an int, such as [0, 1]. "
                f"Received: gpus={gpus!r}"
            )
        if device_id < 0:
            raise errors.DeviceRequestError(
                "Device ids in `gpus` start at 0 and cannot be negative. "
                f"Received: gpus={gpus!r}"
            )
    duplicates = sorted({d for d in gpus if list(gpus).count(d) > 1})
    if duplicates:
        raise errors.DeviceRequestError(
            f"`gpus` names device {duplicates[0]} more than once; each device "
            f"can hold one replica. Received: gpus={gpus!r}"
        )
