"""A Keras user's training function, run as a Ray Train user runs it, and the
same function on one device for reference.

Usage: train_job.py WAY ENGINE FOLDER

- WAY "ray": this script is the Ray driver, as a user's script is. It starts
  a local Ray cluster and runs `train_func` in 2 workers under
  ray.train.torch.TorchTrainer (ENGINE torch) or
  ray.train.tensorflow.TensorflowTrainer (ENGINE tensorflow); the workers get
  KERAS_BACKEND from the job's runtime_env. Each worker compiles with
  backend_agnostic_compile.
- WAY "ray-own-strategy" (tensorflow): the same, with the function written as
  Ray's TensorFlow guide writes it: it makes its own
  MultiWorkerMirroredStrategy and builds and compiles the model in its scope.
- WAY "one-device": this process runs `train_func` itself with plain
  `model.compile` (KERAS_BACKEND comes from the environment).

Every process writes what it saw to FOLDER: probe_<rank>.json (Ray's and
agnostic's view of the job, the history) and weights_<rank>.npz. The model
file that the function saves is named after the rank that saved it, so the
test can tell who wrote it. The driver prints one JSON line at the end.
"""
import contextlib
import json
import logging
import os
import sys
import warnings

WORKERS = 2


def train_func(config):
    """What Ray runs in each worker: the user's function, watched."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe = Probe(config)
        model, history = users_function(config, probe)
        probe.write(model, history, caught)


def users_function(config, probe):
    """The user's code: build, compile, fit, save. Only `compile` differs
    between the ways; `probe` looks on."""
    import keras
    from sklearn.datasets import load_digits

    from agnostic import backend_agnostic_compile

    x, y = load_digits(return_X_y=True)
    x, y = (x[:256] / 16.0).astype("float32"), y[:256]
    scope = contextlib.nullcontext()
    if config["own_strategy"]:
        import tensorflow as tf

        probe.users_strategy = tf.distribute.MultiWorkerMirroredStrategy()
        scope = probe.users_strategy.scope()
    with scope:
        keras.utils.set_random_seed(1)
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(32, activation="relu")(inputs)
        outputs = keras.layers.Dense(10, activation="softmax")(hidden)
        model = keras.Model(inputs, outputs)
        settings = dict(loss="sparse_categorical_crossentropy",
                        optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"])
        probe.before_compile()
        if config["compile"] == "agnostic":
            model = backend_agnostic_compile(model, **settings)
        else:
            model.compile(**settings)
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    model.save(os.path.join(config["folder"], f"saved_by_rank_{probe.rank}.keras"))
    return model, history.history


class Probe:
    """What the test checks, recorded beside the user's code: Ray's place for
    this worker, agnostic's plan, the engine's process group or strategy,
    agnostic's log and warnings, the history and the weights."""

    def __init__(self, config):
        self.folder = config["folder"]
        self.seen = {"variables": {name: os.environ.get(name) for name in (
            "KERAS_BACKEND", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
            "MASTER_PORT", "TF_CONFIG", "AGNOSTIC_CPU_DEVICES")}}
        self.rank = 0
        if config["under_ray"]:
            import ray.train

            context = ray.train.get_context()
            self.rank = context.get_world_rank()
            self.seen["ray"] = {"rank": self.rank, "world_size": context.get_world_size(),
                                "local_rank": context.get_local_rank()}
        from tests.models import Records

        self.records = Records()
        logging.getLogger("agnostic").addHandler(self.records)
        logging.getLogger("agnostic").setLevel(logging.INFO)
        self.torch_groups = []
        self.users_strategy = None

    def before_compile(self):
        self.seen["torch_group_before"] = self._torch_group()

    def write(self, model, history, caught):
        import keras
        import numpy as np

        import agnostic

        self.seen["backend"] = keras.backend.backend()
        self.seen["torch_group_after"] = self._torch_group()
        # The default group after fit is the very object Ray made.
        self.seen["same_torch_group"] = (len(self.torch_groups) == 2
                                         and self.torch_groups[0] is self.torch_groups[1])
        if keras.backend.backend() == "tensorflow":
            self.seen["tf_strategy"] = self._tf_strategy(model)
        plan = agnostic.resolve()
        self.seen["plan"] = {"strategy": plan.strategy, "num_replicas": plan.num_replicas,
                             "num_processes": plan.num_processes,
                             "process_id": plan.process_id, "reason": plan.reason}
        self.seen["history"] = {name: [float(v) for v in values]
                                for name, values in history.items()}
        self.seen["logs"] = self.records.messages
        self.seen["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught
                                 if w.category.__module__.startswith("agnostic")]
        with open(os.path.join(self.folder, f"probe_{self.rank}.json"), "w") as handle:
            json.dump(self.seen, handle, indent=1)
        np.savez(os.path.join(self.folder, f"weights_{self.rank}.npz"), *model.get_weights())

    def _torch_group(self):
        """The default torch process group as this process sees it, if any."""
        if "torch" not in sys.modules:
            return None
        import torch.distributed as dist

        if not dist.is_initialized():
            return {"initialized": False}
        self.torch_groups.append(dist.group.WORLD)
        return {"initialized": True, "rank": dist.get_rank(),
                "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}

    def _tf_strategy(self, model):
        """The tf.distribute strategy the returned model trains under."""
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is None:
            return None
        resolver = getattr(strategy, "cluster_resolver", None)
        return {"class": type(strategy).__name__,
                "num_replicas_in_sync": strategy.num_replicas_in_sync,
                "task_id": getattr(resolver, "task_id", None),
                "is_users": strategy is self.users_strategy}


def run_under_ray(engine, folder, own_strategy):
    import ray
    from ray.train import RunConfig, ScalingConfig

    if engine == "torch":
        from ray.train.torch import TorchTrainer as Trainer
    else:
        from ray.train.tensorflow import TensorflowTrainer as Trainer
    # A fresh local cluster, sized for a small machine; the workers get the
    # engine from the job's runtime_env, as on a real cluster.
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"KERAS_BACKEND": engine}})
    try:
        trainer = Trainer(
            train_func,
            train_loop_config={"folder": folder, "compile": "agnostic", "under_ray": True,
                               "own_strategy": own_strategy},
            scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False,
                                         resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(storage_path=os.path.join(folder, "ray_results"),
                                 name=f"agnostic-{engine}"),
        )
        trainer.fit()  # raises when a worker failed, with its traceback
    finally:
        ray.shutdown()


def main():
    way, engine, folder = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
    if way == "one-device":
        train_func({"folder": folder, "compile": "plain", "under_ray": False,
                    "own_strategy": False})
    else:
        run_under_ray(engine, folder, own_strategy=way == "ray-own-strategy")
    print(json.dumps({"way": way, "engine": engine, "finished": True}))


if __name__ == "__main__":
    main()
