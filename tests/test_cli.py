"""`agnostic info` and `python -m agnostic info` in a real process; `agnostic
launch`'s flags (torchrun's, in both spellings), their checks and its refusal of
a missing script or module before anything starts. No engine is needed: torch
is faked where `--nproc-per-node auto` counts its GPUs."""
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
import types

import pytest

from agnostic import cli, errors
from agnostic.cluster import listen
from agnostic.launch import nodes, output, processes, rendezvous, settings
from tests.conftest import ROOT, cpu_devices


def run_info(*command):
    return subprocess.run(list(command), capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=dict(os.environ))


@functools.lru_cache(maxsize=None)
def installed_info():
    """`agnostic info` through the installed console script, with the test's
    variables: run once by each test process, read by the tests below (it
    asks each installed engine in a process of its own: seconds)."""
    script = os.path.join(os.path.dirname(sys.executable), "agnostic")
    return run_info(script, "info")


def test_info_reports_versions_and_the_plan():
    result = installed_info()
    assert "python: " in result.stdout
    assert "keras: " in result.stdout
    try:
        import keras
    except ImportError:
        assert result.returncode == 0  # info found what is missing, and says so
        assert "keras: not installed" in result.stdout
        assert "plan: unavailable: agnostic needs Keras" in result.stdout
        return
    assert result.returncode == 0, result.stderr
    # Every Keras the tox matrix installs is in the tested range.
    assert f"keras: {keras.__version__} (tested)" in result.stdout
    backend = os.environ.get("KERAS_BACKEND")
    assert f"backend: {backend}" in result.stdout
    assert "plan: strategy=" in result.stdout
    assert "reason: " in result.stdout
    # What agnostic.device(i) means here, and what runs the placements.
    placements = {"tensorflow": "strategy tf-device-parallel", "jax": "strategy "
                  "jax-model-parallel", "torch": "strategy torch-device-parallel",
                  "mxnet": "agnostic.device() placements are ignored on mxnet"}
    if backend in placements:
        assert placements[backend] in result.stdout
    # What shard=True would split here, or why it is refused.
    shard = {"jax": "shard=True: strategy jax-sharded: each large weight and its optimizer "
                    "state split over the", "torch": "shard=True: strategy torch-sharded: each "
                    "process holds 1/", "tensorflow": "shard=True: "
                    "refused: tf-mirrored on tensorflow, where tensorflow does not shard yet",
             "mxnet": "shard=True: refused: mxnet-context on mxnet, where mxnet does not "
                      "shard yet"}
    if backend in shard and cpu_devices() > 1:
        assert shard[backend] in result.stdout, result.stdout
    if backend in ("tensorflow", "jax", "torch") and cpu_devices() > 1:
        assert f"agnostic.device(i), i in 0 to {cpu_devices() - 1}, runs a layer call on " \
               "device i (0: " in result.stdout


def info_with(tmp_path, **variables):
    """`agnostic info` in a real process, with these variables (None: unset)
    and its own KERAS_HOME."""
    env = dict(os.environ, KERAS_HOME=str(tmp_path))
    for name, value in variables.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return subprocess.run([sys.executable, "-m", "agnostic", "info"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)


def keras_is_installed():
    """Whether Keras is here; where the environment requires an engine
    (AGNOSTIC_REQUIRE_ENGINE=1), its absence fails instead of choosing the
    tests' other branch."""
    import importlib.util

    found = importlib.util.find_spec("keras") is not None
    if not found and os.environ.get("AGNOSTIC_REQUIRE_ENGINE") == "1":
        pytest.fail("AGNOSTIC_REQUIRE_ENGINE=1 and Keras is not installed here")
    return found


# What an engine's environment would add to this test and the conflict's
# below is the other engines asked, each in a process of its own: time only.
@pytest.mark.engine_free
def test_info_names_an_unknown_engine_without_a_traceback(tmp_path):
    result = info_with(tmp_path, KERAS_BACKEND="jaxx")
    assert result.returncode == 0  # the advice is the answer
    assert "engine: jaxx (from KERAS_BACKEND" in result.stdout
    assert ("plan: unavailable: KERAS_BACKEND names the engine 'jaxx', which Keras does "
            "not know. Use one of: tensorflow, jax, torch") in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_info_says_where_the_engine_comes_from_and_how_to_switch(tmp_path):
    # KERAS_BACKEND unset: Keras reads keras.json, here naming an engine this
    # environment does not have (openvino is in no tox environment).
    (tmp_path / "keras.json").write_text('{"backend": "openvino"}')
    result = info_with(tmp_path, KERAS_BACKEND=None)
    path = str(tmp_path / "keras.json")
    assert f"engine: openvino (from {path}; switch with KERAS_BACKEND=...)" in result.stdout
    assert result.returncode == 0  # a missing engine is named, with the advice
    if keras_is_installed():
        assert (f"plan: unavailable: Keras is installed, and its engine is openvino (from "
                f"{path}), which cannot be imported") in result.stdout
        assert "Install openvino, or choose an installed one, e.g. KERAS_BACKEND=" \
            in result.stdout
    else:
        assert "plan: unavailable: agnostic needs Keras, which is not installed" \
            in result.stdout
    # Neither variable nor file: Keras's default, said so.
    (tmp_path / "keras.json").unlink()
    default = info_with(tmp_path, KERAS_BACKEND=None)
    assert "engine: tensorflow (from Keras's default" in default.stdout


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_info_names_a_bad_cpu_device_count(tmp_path, value):
    result = info_with(tmp_path, AGNOSTIC_CPU_DEVICES=value)
    assert result.returncode == 1
    assert ("plan: unavailable: AGNOSTIC_CPU_DEVICES must be a whole number of CPU devices, "
            f"1 or more, such as AGNOSTIC_CPU_DEVICES=4. Received: AGNOSTIC_CPU_DEVICES="
            f"{value!r}") in result.stdout


def test_info_shows_the_single_device_warning_with_its_fix(tmp_path):
    if not keras_is_installed():
        pytest.skip("no engine in this environment: no plan to show")
    # No GPU visible (also on a machine that has some), no CPU split.
    result = info_with(tmp_path, AGNOSTIC_CPU_DEVICES=None, CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "plan: strategy=single-device" in result.stdout
    assert "warning: " in result.stdout and "AGNOSTIC_CPU_DEVICES=N" in result.stdout


def test_info_json_is_a_whole_environment_report_without_engine_noise(tmp_path):
    result = subprocess.run([sys.executable, "-m", "agnostic", "info", "--json"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env=dict(os.environ, KERAS_HOME=str(tmp_path)))
    report = json.loads(result.stdout)
    for key in ("agnostic", "python", "os", "cpus", "memory_gb", "nvidia_smi", "engine",
                "keras", "engines", "variables", "plan"):
        assert key in report, key
    assert report["cpus"] == os.cpu_count()
    import importlib.util

    for engine in ("tensorflow", "jax", "torch"):
        answer = report["engines"][engine]
        if importlib.util.find_spec(engine) is None:
            assert answer == {"version": None}
            continue
        # Each installed engine was asked, in its own process, what it sees.
        assert "error" not in answer, answer
        assert answer["gpus"] == 0  # no GPU on the machines the tests run on
    if keras_is_installed():
        assert result.returncode == 0, result.stderr[-2000:]
        assert report["plan"]["backend"] == os.environ["KERAS_BACKEND"]
        assert report["plan"]["replicas"] == max(1, cpu_devices())
    else:
        assert result.returncode == 0
        assert "agnostic needs Keras" in report["plan"]["unavailable"]
    # The engines' start-up lines (TensorFlow's oneDNN and CUDA notices, ...)
    # stay in the processes that asked them.
    assert result.stderr == ""


def test_info_text_names_each_engine_and_what_it_sees():
    result = installed_info()
    assert "nvidia gpus: " in result.stdout and "cpus: " in result.stdout
    import importlib.util

    for engine in ("tensorflow", "jax", "torch"):
        if importlib.util.find_spec(engine) is not None:
            assert re.search(rf"^{engine}: \S+ \(sees 0 GPU\(s\)", result.stdout, re.M), \
                result.stdout
        else:
            assert f"{engine}: not installed" in result.stdout
    assert result.stderr == ""


def test_version(capsys):
    import agnostic

    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"agnostic {agnostic.__version__}"


def test_console_script_is_installed():
    # (`python -m agnostic info`, the other way: the tests of info_with.)
    assert "plan:" in installed_info().stdout


# `agnostic launch`: parsing (cli.py) and checking (launch/settings.py).
LAUNCH_DEFAULTS = {
    "--nproc-per-node N, --nproc_per_node N": "1",
    "--nnodes M": "1",
    "--node-rank R, --node_rank R": "0",
    "--master-addr HOST, --master_addr HOST": "127.0.0.1",
    "--master-port PORT, --master_port PORT": "29500, torchrun's",
    "--master HOST:PORT": "not set",
    "--rdzv-endpoint HOST:PORT, --rdzv_endpoint HOST:PORT": "not set",
    "--rdzv-backend NAME, --rdzv_backend NAME": "static",
    "--rdzv-id ID, --rdzv_id ID": "none",
    "--max-restarts N, --max_restarts N": "0",
    "--log-dir DIR, --log_dir DIR": "only what the terminal does not show, in a folder of "
                                    "the temp dir",
    "--tee {0,1,2,3}": "0, rank 0's output and the others' stderr",
    "--local-ranks-filter RANKS, --local_ranks_filter RANKS": "all",
    "--standalone": "off",
    "--secret-file PATH, --secret_file PATH": "AGNOSTIC_JOB_SECRET_FILE, else AGNOSTIC_JOB_SECRET",
    "--listen-addr ADDRESS, --listen_addr ADDRESS": "the master address",
    "-m, --module": "off, SCRIPT is a file",
}


def launch_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["launch", "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_launch_help_names_every_flag_with_its_default(capsys):
    text = launch_help(capsys)
    # Each flag's entry, from its name to the next flag's.
    entries = re.split(r"\n  (?=-)", text.split("options:")[-1].split("examples:")[0])
    for flag, default in LAUNCH_DEFAULTS.items():
        entry = next(e for e in entries if e.startswith(flag))
        assert f"(default: {default})" in " ".join(entry.split()), entry
    auto = " ".join(text.split())
    assert ("the launcher also uses PORT+1 (torch) and PORT+2 (JAX) there (default: 29500"
            in auto)
    assert settings.DEFAULT_MASTER_PORT == 29500  # torchrun's
    assert "auto: for torch one process per CUDA GPU" in auto
    assert "for TensorFlow and JAX 1, as one process uses every device of its node" in auto


@pytest.fixture
def launched(monkeypatch):
    """What `agnostic launch` would run: (command, Settings), nothing started."""
    calls = []
    monkeypatch.setattr(nodes, "run", lambda command, settings: calls.append(
        (command, settings)) or 0)
    return calls


def test_launch_defaults(launched):
    assert cli.main(["launch", "train.py"]) == 0
    assert launched == [(["train.py"], settings.Settings(1, 1, 0, "127.0.0.1", 29500))]
    assert launched[0][1].max_restarts == 0 and launched[0][1].run_id == "none"
    assert launched[0][1].output == output.Output(log_dir=None, tee=0, local_ranks=None)


@pytest.mark.parametrize("spelling", ["-", "_"])
def test_launch_flags_in_both_spellings(launched, spelling):
    argv = [f"--nproc{spelling}per{spelling}node", "4", "--nnodes", "2",
            f"--node{spelling}rank", "1", f"--master{spelling}addr", "10.0.0.1",
            f"--master{spelling}port", "29500", "train.py", "--epochs", "3"]
    assert cli.main(["launch"] + argv) == 0
    assert launched == [(["train.py", "--epochs", "3"],
                         settings.Settings(4, 2, 1, "10.0.0.1", 29500))]


def test_launch_runs_a_module_like_python_dash_m(launched):
    assert cli.main(["launch", "--nproc-per-node", "2", "-m", "mypkg.train", "--lr", "0.1"]) == 0
    assert launched[0][0] == ["-m", "mypkg.train", "--lr", "0.1"]


@pytest.mark.parametrize("argv", [
    ["--master", "10.0.0.1:29500"],
    ["--master", "10.0.0.1:29500", "--master-addr", "10.0.0.1", "--master-port", "29500"],
])
def test_master_in_either_form(launched, argv):
    assert cli.main(["launch"] + argv + ["train.py"]) == 0
    assert launched[0][1] == settings.Settings(1, 1, 0, "10.0.0.1", 29500)


def test_standalone_picks_a_free_master_port(launched, monkeypatch):
    # The first free port offered has the port after it (torch's store) taken,
    # here by a real listener: it is passed over. (Whether a port is still free
    # once chosen is not checked: another test's process may take it by then.)
    real, asked = processes.free_port, []
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        offered = [taken.getsockname()[1] - 1]
        monkeypatch.setattr(processes, "free_port",
                            lambda: offered.pop() if offered else real())
        held = listen.held
        monkeypatch.setattr(listen, "held", lambda host, port: asked.append(port) or held(
            host, port))
        assert cli.main(["launch", "--standalone", "--nproc-per-node", "2", "train.py"]) == 0
        passed_over = taken.getsockname()[1] - 1
    chosen = launched[0][1]
    assert chosen.host == "127.0.0.1" and chosen.nproc == 2 and chosen.nnodes == 1
    assert chosen.port != passed_over and passed_over + 1 in asked
    # torch's store and JAX's coordinator: found free as the port was chosen.
    assert asked[-2:] == [chosen.port + 1, chosen.port + 2]


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fails the test if a process starts or a node waits for the others."""
    def refuse(*args, **kwargs):
        raise AssertionError("agnostic launch started work before refusing")
    monkeypatch.setattr(output.subprocess, "Popen", refuse)
    monkeypatch.setattr(output, "Folder", refuse)
    monkeypatch.setattr(rendezvous, "Leader", refuse)
    monkeypatch.setattr(rendezvous, "Member", refuse)
    monkeypatch.setattr(processes, "free_ports", refuse)


def refused(capsys, *argv):
    assert cli.main(["launch"] + list(argv)) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert error.startswith("agnostic launch: "), error
    return error


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-node", "0"], "--nproc-per-node must be a whole number, at least 1, "
                                "or auto (one per CUDA GPU for torch, 1 for TensorFlow and "
                                "JAX). Received: --nproc-per-node 0"),
    (["--nproc-per-node", "abc"], "Received: --nproc-per-node abc"),
    (["--nproc_per_node", ""], "Received: --nproc-per-node ''"),
    (["--nnodes", "0"], "--nnodes must be a whole number, at least 1. Received: --nnodes 0"),
    (["--node-rank", "x"], "--node-rank must be a whole number. Received: --node-rank x"),
    (["--node-rank", "2", "--nnodes", "2"], "--node-rank 2 is out of range for --nnodes 2: "
                                            "use 0 to 1"),
    (["--master-port", "70000"], "--master-port must be a free port on node 0, from 1 to "
                                 "65533 (the launcher also uses PORT+1 for torch and PORT+2 "
                                 "for JAX), such as 29500. Received: --master-port 70000"),
    (["--master_port", "http"], "Received: --master-port http"),
    (["--master", "10.0.0.1"], "--master must be HOST:PORT"),
    (["--master", "10.0.0.1:29400", "--master-port", "29500"],
     "--master and --master-port name different masters. Give node 0's address one way: "
     "--master-addr HOST --master-port PORT, or --master HOST:PORT. "
     "Received: --master 10.0.0.1:29400 --master-port 29500"),
    (["--master", "10.0.0.1:29400", "--master-addr", "10.0.0.2"],
     "--master and --master-addr name different masters"),
    (["--master-addr", ""], "--master-addr must be node 0's host name or address"),
    (["--standalone", "--nnodes", "2"], "--standalone runs a single node, but --nnodes 2 "
                                        "asks for 2. Drop --standalone"),
    (["--standalone", "--master-port", "29500"], "--standalone chooses the master itself "
     "(127.0.0.1 and a free port), so it takes no master address. "
     "Received: --standalone --master-port 29500"),
    (["--standalone", "--rdzv-endpoint", "10.0.0.1:29500"],
     "Received: --standalone --rdzv-endpoint 10.0.0.1:29500"),
    # torchrun's flags that agnostic launch does not follow, and bad values of its own.
    (["--nnodes", "1:4"], "--nnodes 1:4 asks for an elastic number of nodes (MIN:MAX), which "
                          "agnostic launch does not support: every node must be there from "
                          "the start. Give one number, such as --nnodes 4."),
    (["--nnodes", "2:x"], "--nnodes must be a whole number, at least 1. Received: --nnodes 2:x"),
    (["--rdzv-backend", "etcd"], "--rdzv-backend etcd is not supported: agnostic launch meets "
     "the nodes itself, node 0's launcher listening at the master address (--master or "
     "--rdzv-endpoint HOST:PORT). Use --rdzv-backend static or c10d (both mean that), or "
     "leave it out. Received: --rdzv-backend etcd"),
    (["--rdzv_backend", "etcd-v2"], "Received: --rdzv-backend etcd-v2"),
    (["--rdzv-id", ""], "--rdzv-id must be a name for the run, such as --rdzv-id job42 "
                        "(it names the run's folder under --log-dir), without '/'. "
                        "Received: --rdzv-id ''"),
    (["--rdzv-id", "a/b"], "Received: --rdzv-id a/b"),
    (["--max-restarts", "-1"], "--max-restarts must be a whole number, at least 0. "
                               "Received: --max-restarts -1"),
    (["--max_restarts", "two"], "Received: --max-restarts two"),
    (["--max-restarts", "2", "--nnodes", "2"],
     "--max-restarts 2 restarts the processes of one node, but --nnodes 2 asks for 2: "
     "restarts are supported on one node only. Drop --max-restarts with several nodes"),
    (["--tee", "4"], "--tee must be 0, 1, 2 or 3: what every process also shows on the "
                     "terminal besides its log files (1 standard output, 2 standard error, "
                     "3 both; only the whole node's value, not torchrun's per-rank form). "
                     "Received: --tee 4"),
    (["--tee", "0:3,1:1"], "Received: --tee 0:3,1:1"),
    (["--tee", "all"], "Received: --tee all"),
    (["--nproc-per-node", "2", "--local-ranks-filter", "2"],
     "--local-ranks-filter must list local ranks, from 0 to --nproc-per-node - 1 (1 here), "
     "separated by commas, such as --local-ranks-filter 0 or 0,2: only their output is "
     "shown on the terminal (all of it stays in the log files). "
     "Received: --local-ranks-filter 2"),
    (["--local_ranks_filter", "0,x"], "Received: --local-ranks-filter 0,x"),
    (["--local-ranks-filter", ""], "Received: --local-ranks-filter ''"),
    (["--local-ranks-filter", "-1"], "Received: --local-ranks-filter -1"),
    # IPv6: in brackets with a port; a bracket never reaches the host.
    (["--master", "::1:29500"], "--master ::1:29500 is ambiguous: an IPv6 address and its "
                                "port are written with the address in brackets, such as "
                                "--master [::1]:29500. Received: --master ::1:29500"),
    (["--master", "[::1]"], "--master must be HOST:PORT, the address of node 0 and a free "
                            "port on it (1 to 65533), such as 10.0.0.1:29500, or "
                            "[::1]:29500 for an IPv6 address. Received: --master '[::1]'"),
    (["--master", "[10.0.0.1]:29500"], "Received: --master '[10.0.0.1]:29500'"),
    (["--rdzv-endpoint", "host"], "--rdzv-endpoint must be HOST:PORT"),
    (["--master-addr", "[::1]:29500"], "--master-addr must be node 0's host name or address, "
                                       "such as 10.0.0.1 or ::1, without a port (give it "
                                       "with --master-port). Received: --master-addr "
                                       "'[::1]:29500'"),
    (["--master", "10.0.0.1:29500", "--rdzv-endpoint", "10.0.0.2:29500"],
     "--master and --rdzv-endpoint name different masters. Give node 0's address one way: "
     "--master-addr HOST --master-port PORT, or --master HOST:PORT. Received: --master "
     "10.0.0.1:29500 --rdzv-endpoint 10.0.0.2:29500"),
    (["--rdzv-endpoint", "[::1]:29500", "--master-port", "29501"],
     "--rdzv-endpoint and --master-port name different masters"),
])
def test_bad_launch_values_are_refused_before_any_work(capsys, nothing_starts, argv, message):
    assert message in refused(capsys, *(argv + ["train.py"]))


def test_a_log_dir_that_cannot_hold_files_is_refused(capsys, nothing_starts, tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    error = refused(capsys, "--log-dir", str(tmp_path / "taken"), "train.py")
    assert (f"--log-dir must be a folder this user can write to (made if missing), such as "
            f"--log-dir ./logs; {tmp_path / 'taken'} cannot be used (") in error
    assert f"Received: --log-dir {tmp_path / 'taken'}" in error


@pytest.mark.parametrize("spelling", ["-", "_"])
def test_torchrun_flags_in_both_spellings(launched, tmp_path, spelling):
    logs = str(tmp_path / "logs")
    argv = [f"--nproc{spelling}per{spelling}node", "3", "--nnodes", "1:1",
            f"--rdzv{spelling}endpoint", "10.0.0.1:29600", f"--rdzv{spelling}backend", "c10d",
            f"--rdzv{spelling}id", "job42", f"--max{spelling}restarts", "2",
            f"--log{spelling}dir", logs, "--tee", "3",
            f"--local{spelling}ranks{spelling}filter", "0,2", "train.py", "--epochs", "3"]
    assert cli.main(["launch"] + argv) == 0
    assert launched == [(["train.py", "--epochs", "3"], settings.Settings(
        3, 1, 0, "10.0.0.1", 29600, max_restarts=2, run_id="job42",
        output=output.Output(log_dir=logs, tee=3, local_ranks=frozenset({0, 2}))))]
    assert os.path.isdir(logs)  # made before anything starts


@pytest.mark.parametrize("backend", ["static", "c10d", "C10D"])
def test_torchruns_rendezvous_backends_mean_ours(launched, backend):
    assert cli.main(["launch", "--rdzv-backend", backend, "train.py"]) == 0
    assert launched[0][1] == settings.Settings(1)


@pytest.mark.parametrize("argv, host, port", [
    (["--master", "[::1]:29600"], "::1", 29600),
    (["--rdzv-endpoint", "[2001:db8::5]:29600"], "2001:db8::5", 29600),
    (["--master-addr", "::1"], "::1", 29500),
    (["--master-addr", "[::1]", "--master-port", "29600"], "::1", 29600),
    (["--master", "[::1]:29600", "--master-addr", "::1", "--rdzv-endpoint", "[::1]:29600"],
     "::1", 29600),
])
def test_an_ipv6_master_is_kept_without_brackets(launched, argv, host, port):
    assert cli.main(["launch"] + argv + ["train.py"]) == 0
    assert (launched[0][1].host, launched[0][1].port) == (host, port)


def test_nproc_error_comes_before_the_missing_script(capsys, nothing_starts):
    assert "--nproc-per-node" in refused(capsys, "--nproc-per-node", "0", "missing.py")


@pytest.fixture
def port():
    """A free port, found before `nothing_starts` refuses the search for one."""
    return processes.free_port()


@pytest.mark.serial  # a refusal within seconds: run alone (tox: -m serial)
def test_missing_script_is_refused_without_waiting_for_other_nodes(capsys, port, nothing_starts):
    began = time.monotonic()
    error = refused(capsys, "--nnodes", "2", "--node-rank", "1", "--master-port",
                    str(port), "missing_train.py", "--epochs", "3")
    assert time.monotonic() - began < 10
    assert "The script 'missing_train.py' does not exist (relative to " in error
    assert "Expected the Python file every process runs, such as train.py, or -m" in error
    assert "Check the path, or run from the script's folder." in error


@pytest.mark.parametrize("module, reason", [
    ("no_such_package.train", " (No module named 'no_such_package')"),
    ("json.no_such_module", ""),
    ("agnostic.launch", ""),  # a package without __main__.py
])
def test_missing_module_is_refused(capsys, nothing_starts, module, reason):
    error = refused(capsys, "--nproc-per-node", "2", "-m", module, "--lr", "0.1")
    assert f"-m {module}: no module {module!r} to run was found from " in error
    assert f"or sys.path{reason}. Expected what `python -m {module}` runs" in error
    assert "Run from the folder that holds the package, or add that folder" in error


def test_module_is_found_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "tinypkg").mkdir()
    (tmp_path / "tinypkg" / "__init__.py").write_text("")
    (tmp_path / "tinypkg" / "train.py").write_text("")
    (tmp_path / "tinypkg" / "__main__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    try:
        settings.check_command(["-m", "tinypkg.train", "--lr", "0.1"])
        settings.check_command(["-m", "tinypkg"])  # a package runs its __main__
    finally:  # finding a submodule imported its package, as `python -m` does
        for name in [n for n in sys.modules if n.split(".")[0] == "tinypkg"]:
            del sys.modules[name]
    assert sys.path == before


def test_missing_script_exit_status_in_a_real_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "agnostic", "launch", "--nproc-per-node", "2", "missing.py"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
    assert result.returncode == 2
    assert "agnostic launch: The script 'missing.py' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def fake_torch(monkeypatch, gpus):
    counted = []
    cuda = types.SimpleNamespace(device_count=lambda: counted.append(gpus) or gpus)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    return counted


@pytest.mark.parametrize("environ, gpus, processes", [
    ({"KERAS_BACKEND": "torch", "AGNOSTIC_CPU_DEVICES": "3"}, 0, 3),
    ({"KERAS_BACKEND": "torch"}, 0, 1),
    ({"KERAS_BACKEND": "torch", "AGNOSTIC_CPU_DEVICES": "3"}, 2, 2),  # GPUs first
])
def test_auto_on_torch_counts_gpus_or_cpu_devices(monkeypatch, environ, gpus, processes):
    counted = fake_torch(monkeypatch, gpus)
    assert settings.auto_nproc(environ) == processes
    assert counted == [gpus]


def test_auto_reads_the_engine_from_keras_json(tmp_path, monkeypatch):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    fake_torch(monkeypatch, 0)
    environ = {"KERAS_HOME": str(tmp_path), "AGNOSTIC_CPU_DEVICES": "2"}
    assert settings.auto_nproc(environ) == 2


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_auto_is_one_process_per_node_on_jax_and_tensorflow(monkeypatch, backend):
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would fail
    environ = {"KERAS_BACKEND": backend, "AGNOSTIC_CPU_DEVICES": "4"}
    assert settings.auto_nproc(environ) == 1


@pytest.mark.parametrize("backend, gpus, processes", [
    ("torch", 0, 3), ("torch", 2, 2), ("jax", 2, 1), ("tensorflow", 2, 1)])
def test_launch_auto_from_the_command_line(monkeypatch, launched, backend, gpus, processes):
    monkeypatch.setenv("KERAS_BACKEND", backend)
    monkeypatch.setenv("AGNOSTIC_CPU_DEVICES", "3")
    fake_torch(monkeypatch, gpus)
    assert cli.main(["launch", "--nproc_per_node", "auto", "train.py"]) == 0
    assert launched[0][1].nproc == processes


def test_auto_without_torch_is_explained(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(errors.LaunchError, match=r"--nproc-per-node auto counts torch's "
                       r"CUDA GPUs, but torch cannot be imported .* such as --nproc-per-node 4"):
        settings.auto_nproc({"KERAS_BACKEND": "torch"})


def test_auto_with_bad_cpu_devices_is_a_launch_error(monkeypatch):
    fake_torch(monkeypatch, 0)
    with pytest.raises(errors.LaunchError, match=r"--nproc-per-node auto: AGNOSTIC_CPU_DEVICES "
                       r"must be a whole number"):
        settings.auto_nproc({"KERAS_BACKEND": "torch", "AGNOSTIC_CPU_DEVICES": "many"})


@pytest.mark.engine_free
def test_info_names_the_other_agnostic_distribution_when_installed(tmp_path):
    # The registry's "agnostic" (an unrelated database migration tool) shares
    # the import name; its metadata alone is made here, on the path.
    info = tmp_path / "site" / "agnostic-1.0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agnostic\nVersion: 1.0.3\n"
                                   "Summary: Agnostic Database Migrations\n")
    path = os.pathsep.join([str(tmp_path / "site"), ROOT])
    result = subprocess.run([sys.executable, "-m", "agnostic", "info", "--json"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=path, KERAS_HOME=str(tmp_path)))
    conflict = json.loads(result.stdout)["conflict"]
    assert "the distribution 'agnostic' 1.0.3 (Agnostic Database Migrations" in conflict
    assert "pip uninstall agnostic" in conflict
