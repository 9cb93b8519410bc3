"""The process group a process belongs to, from torchrun's variables."""
import dataclasses
import os

from agnostic import errors

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Where this process stands: its rank, the group's size, the rendezvous."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @property
    def is_chief(self):
        return self.rank == 0

    @property
    def address(self):
        return f"tcp://{self.master_addr}:{self.master_port}"


def from_environment(environ=None):
    """The group that torchrun (or agnostic's own launcher) started this
    process in, or None when this process was started plainly."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    try:
        group = ProcessGroup(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(environ.get("MASTER_PORT", "29500")),
        )
    except ValueError as error:
        shown = {name: environ.get(name) for name in VARIABLES}
        raise errors.DeviceRequestError(
            "RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be whole numbers, "
            f"as torchrun sets them. Received: {shown}"
        ) from error
    if not 0 <= group.rank < group.world_size:
        raise errors.DeviceRequestError(
            f"RANK must be between 0 and WORLD_SIZE - 1. Received: RANK={group.rank}, "
            f"WORLD_SIZE={group.world_size}"
        )
    return group
