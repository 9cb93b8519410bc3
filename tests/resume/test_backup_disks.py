"""Machines without a shared disk whose ranks change at restart: two
`agnostic launch` nodes on 127.0.0.1, each backing up to a folder of its own
(NODE_FOLDER), as two machines' disks would be. The newest backup lies on
node 1's disk only, as when the machine that was the chief comes back as
rank 1: the job must resume from it. The second machine is the only thing
simulated (both nodes are this machine)."""
import json
import os

from tests import models
from tests.conftest import engine_or_skip
from tests.jobs import finish

keras = engine_or_skip()

import agnostic  # noqa: E402

from tests.launch.test_nodes import REPLICAS, start_node  # noqa: E402
from agnostic.launch.processes import free_port  # noqa: E402

SCRIPT = os.path.join("tests", "scripts", "checkpoints.py")


def run_nodes(folder, **variables):
    port = free_port()
    nodes = [start_node(rank, port, SCRIPT, "own-folders", REPLICAS, folder,
                        NODE_FOLDER=str(folder / f"node{rank}"), **variables)
             for rank in (0, 1)]
    codes, outputs, _ = finish(nodes, 300)
    assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]


def one_device(epochs, backup=None):
    """The weights of a run on one device, in this process; `backup`: a
    BackupAndRestore folder it leaves its last backup in."""
    model = agnostic.backend_agnostic_compile(
        models.build(keras), optimizer=keras.optimizers.SGD(0.1, momentum=0.9), gpus=1,
        **models.COMPILE)
    callbacks = [keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)] if backup else []
    x, y = models.data()
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model.get_weights()


def test_a_job_resumes_from_the_backup_another_rank_holds(tmp_path):
    # Epochs 0 and 1, backed up on what is now node 1's disk; node 0's is empty.
    (tmp_path / "node0").mkdir()
    one_device(2, backup=str(tmp_path / "node1" / "backup"))
    run_nodes(tmp_path, EPOCHS="4")
    for rank in (0, 1):
        assert json.loads((tmp_path / f"epochs-{rank}.json").read_text()) == [2, 3]
    logs = json.loads((tmp_path / "logs-0.json").read_text())
    said = [line for line in logs if line.startswith("BackupAndRestore resumes")]
    assert len(said) == 1 and said[0].startswith("BackupAndRestore resumes at epoch 2, step 0, "
                                                 f"from the backup in {tmp_path / 'node1'}")
    assert said[0].endswith("(process 1 of 2).")
    assert not [line for line in json.loads((tmp_path / "logs-1.json").read_text())
                if line.startswith("BackupAndRestore")]  # the chief alone says it
    finals = [models.saved_weights(tmp_path / f"final-{rank}.npz") for rank in (0, 1)]
    assert models.relative_difference(one_device(4), finals[0]) < 1e-5
    assert models.relative_difference(finals[0], finals[1]) < 1e-5
    # Training done, delete_checkpoint: no backup is left on either disk for
    # a next run to resume from (node 1's was the one restored, untouched since).
    assert not os.path.exists(tmp_path / "node0" / "backup")
    assert os.listdir(tmp_path / "node1" / "backup") == []
