"""What every strategy shares: the interface (agnostic/methods.py patches
one model's methods for them)."""


class Strategy:
    """Executes a Plan: distributes the program's model, in place, and
    compiles it with the program's arguments (an in_place.CompileCall)."""

    name = ""

    def __init__(self, plan, cpu_merge=True, cpu_relocation=False, sync_batch_norm=True,
                 global_view=True):
        self.plan = plan
        self.global_view = global_view
        self.cpu_merge = cpu_merge
        self.cpu_relocation = cpu_relocation
        self.sync_batch_norm = sync_batch_norm

    @staticmethod
    def refuse(model, call):
        """Raises for what this strategy cannot train, before any work: no
        process is started and nothing compiled yet."""

    def compile(self, model, call):
        raise NotImplementedError


def scope_replicas():
    """The number of replicas of the tf.distribute strategy in scope."""
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync
