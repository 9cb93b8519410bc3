"""What the global view costs (agnostic/fit/global_batch.py): the same
convolutional network (batch_norm.py's) trained through agnostic on several
devices with `global_view=True` (the default: each step's data gathered to
every replica, each call's outputs gathered back, the loss and metrics over
the whole batch on every replica) and `False` (each replica's share alone),
alternating in the same process after a warm-up. TensorFlow and torch (JAX's
one program always sees the global batch).

    python benchmarks/global_view.py              # 2 devices
    python benchmarks/global_view.py --smoke      # seconds: checks it runs
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_norm  # noqa: E402
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("global_view", "per_replica")


def child(options):
    batch_norm.timed(options, WAYS, lambda way: {"global_view": way == "global_view",
                                                 "metrics": ["accuracy"]})


def note(options):
    """What each step gathers to every replica, in float32 and int64: the
    images and labels, and the model's outputs (logits)."""
    images = 4
    for size in batch_norm.IMAGE:
        images *= size
    return {"gathered_bytes_per_step": options.batch * (images + 8 + 4 * batch_norm.CLASSES)}


def main():
    return common.two_ways_main(__doc__, SCRIPT, "global_view", WAYS,
                                ("global view", "per-replica"), child, batch_norm.ENGINES,
                                note=note)


if __name__ == "__main__":
    sys.exit(main())
