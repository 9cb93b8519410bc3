"""torch's set-up as it is imported (agnostic._startup dispatches here by
name): in a job, this process's GPU made the current CUDA device."""
from agnostic import devices as devices_lib
from agnostic import errors


def pin(torch, environment):
    """Makes this process's GPU torch's current CUDA device: the only one
    visible, else the local rank's (a LaunchError where there is none)."""
    torch.cuda.set_device(devices_lib.cuda_index(environment, torch.cuda.device_count()))


def join(torch, environment):
    # Keras on torch puts variables on the current CUDA device: this process's.
    # A local rank past the visible GPUs is left to torch-ddp to refuse.
    if not torch.cuda.is_available():
        return
    try:
        pin(torch, environment)
    except errors.LaunchError:
        return
