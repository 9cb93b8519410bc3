"""Where launched processes' output goes (torchrun's conventions): rank 0's
on the terminal as it is, the other ranks' standard error there with a
[rankN]: prefix, their standard output in log files, never thrown away (a
temporary folder kept, and named at the end, only where a process wrote
what the terminal did not show); --log-dir, --tee and --local-ranks-filter. Real launches of scripts that
import no engine, through `agnostic launch` and through the shim's own
workers (agnostic.launch.local)."""
import glob
import os
import subprocess
import sys

import pytest

from agnostic.launch import output
from tests.launch.launching import environment, launch, read, temporary_logs

# Starts no engine in any process (tests/conftest.py: where it runs).
pytestmark = pytest.mark.engine_free

PRINTS = """import os, sys
rank = os.environ["RANK"]
print(f"stdout of rank {rank}")
print(f"stderr of rank {rank}", file=sys.stderr)
"""


@pytest.fixture
def prints(tmp_path):
    (tmp_path / "prints.py").write_text(PRINTS)
    return tmp_path


def lines(text):
    return text.splitlines()


def test_rank_0_on_the_terminal_the_others_stderr_prefixed_their_stdout_in_a_file(prints):
    code, out, err = launch(prints, "--nproc-per-node", "3", "prints.py")
    assert code == 0, err
    assert lines(out) == ["stdout of rank 0"]  # a plain print, on the terminal
    assert "stderr of rank 0" in lines(err)  # as it is
    assert "[rank1]: stderr of rank 1" in lines(err) and "[rank2]: stderr of rank 2" in lines(err)
    # The others' stdout, which the terminal did not show: in a folder of the
    # temp dir, named once, at the end (their stderr was shown: not filed).
    [folder] = temporary_logs(prints)
    assert err.count(folder) == 1
    files = [os.path.join("attempt_0", f"rank_{rank}", "stdout.log") for rank in (1, 2)]
    assert lines(err)[-1] == (
        f"agnostic launch: what the terminal did not show of the output of ranks 1 and 2 "
        f"is in {folder}: {', '.join(files)}; --log-dir DIR chooses the folder.")
    for rank in (1, 2):
        logs = os.path.join(folder, "attempt_0", f"rank_{rank}")
        assert read(os.path.join(logs, "stdout.log")) == f"stdout of rank {rank}\n"
        assert not os.path.exists(os.path.join(logs, "stderr.log"))
    assert not os.path.exists(os.path.join(folder, "attempt_0", "rank_0"))


def test_one_process_makes_no_log_folder_and_says_nothing(prints):
    code, out, err = launch(prints, "--nproc-per-node", "1", "prints.py")
    assert code == 0, err
    assert (out, err) == ("stdout of rank 0\n", "stderr of rank 0\n")
    assert temporary_logs(prints) == []


def test_a_temporary_log_folder_left_empty_is_removed_and_not_named(tmp_path):
    # Rank 1 writes only what the terminal shows (its stderr): no folder left.
    (tmp_path / "quiet.py").write_text("import sys\nprint('shown', file=sys.stderr)\n")
    code, _, err = launch(tmp_path, "--nproc-per-node", "2", "quiet.py")
    assert code == 0, err
    assert "[rank1]: shown" in lines(err)
    assert "did not show" not in err and temporary_logs(tmp_path) == []


def test_log_dir_holds_every_stream_of_every_process(prints):
    code, out, err = launch(prints, "--nproc_per_node", "2", "--log_dir", "logs",
                            "--rdzv_id", "job7", "prints.py")
    assert code == 0, err
    [run] = glob.glob(str(prints / "logs" / "job7_*"))  # torchrun's <rdzv-id>_<unique>
    assert lines(err)[0] == (f"agnostic launch: the output of ranks 0 and 1 is written to "
                             f"{run}{os.sep}attempt_<n>{os.sep}rank_<r> (stdout.log, "
                             "stderr.log).")  # said at the start
    for rank in (0, 1):
        logs = os.path.join(run, "attempt_0", f"rank_{rank}")
        assert read(os.path.join(logs, "stdout.log")) == f"stdout of rank {rank}\n"
        assert read(os.path.join(logs, "stderr.log")) == f"stderr of rank {rank}\n"
    # The terminal shows what it shows without --log-dir.
    assert lines(out) == ["stdout of rank 0"]
    assert "stderr of rank 0" in lines(err) and "[rank1]: stderr of rank 1" in lines(err)
    assert temporary_logs(prints) == []


@pytest.mark.parametrize("tee, stdout_shown", [("0", False), ("1", True), ("2", False),
                                               ("3", True)])
def test_tee_shows_the_other_ranks_stdout_too(prints, tee, stdout_shown):
    code, out, err = launch(prints, "--nproc-per-node", "2", "--log-dir", "logs", "--tee", tee,
                            "prints.py")
    assert code == 0, err
    others = ["[rank1]: stdout of rank 1"] if stdout_shown else []
    assert sorted(lines(out)) == sorted(["stdout of rank 0"] + others)
    assert "[rank1]: stderr of rank 1" in lines(err)  # shown whatever --tee says
    [run] = glob.glob(str(prints / "logs" / "none_*"))
    rank_1 = os.path.join(run, "attempt_0", "rank_1")
    assert read(os.path.join(rank_1, "stdout.log")) == "stdout of rank 1\n"  # and in the file


def test_local_ranks_filter_shows_only_those_ranks(prints):
    code, out, err = launch(prints, "--nproc-per-node", "3", "--local-ranks-filter", "1,2",
                            "--tee", "3", "prints.py")
    assert code == 0, err
    assert sorted(lines(out)) == ["[rank1]: stdout of rank 1", "[rank2]: stdout of rank 2"]
    assert "stdout of rank 0" not in err and "stderr of rank 0" not in err
    assert "[rank2]: stderr of rank 2" in lines(err)
    # Rank 0's output is not lost: its files are in the temp dir's folder.
    [folder] = temporary_logs(prints)
    assert f"what the terminal did not show of the output of rank 0 is in {folder}" in err
    rank_0 = os.path.join(folder, "attempt_0", "rank_0")
    assert read(os.path.join(rank_0, "stdout.log")) == "stdout of rank 0\n"
    assert read(os.path.join(rank_0, "stderr.log")) == "stderr of rank 0\n"


LOUD = """import os, sys
rank = os.environ["RANK"]
for index in range(20000):  # about 1 MB on each stream
    sys.stdout.write(f"out {rank} {index} " + "o" * 40 + "\\n")
    sys.stderr.write(f"err {rank} {index} " + "e" * 40 + "\\n")
if rank == "1":
    sys.stderr.write("last words without a newline")
"""


def expected_lines(kind, rank):
    return [f"{kind} {rank} {index} " + kind[0] * 40 for index in range(20000)]


def test_a_process_writing_a_lot_never_blocks_and_every_line_arrives(tmp_path):
    # Every stream of both ranks goes through the launcher's reader threads.
    (tmp_path / "loud.py").write_text(LOUD)
    code, out, err = launch(tmp_path, "--nproc-per-node", "2", "--log-dir", "logs",
                            "--tee", "3", "loud.py", timeout=120)
    assert code == 0, err[-2000:]
    shown = lines(out)
    assert [l for l in shown if l.startswith("out 0 ")] == expected_lines("out", 0)
    assert [l[len("[rank1]: "):] for l in shown if l.startswith("[rank1]: ")] == \
        expected_lines("out", 1)
    said = lines(err)
    assert [l[len("[rank1]: "):] for l in said if l.startswith("[rank1]: err")] == \
        expected_lines("err", 1)
    assert "[rank1]: last words without a newline" in said  # its line ended for it
    [run] = glob.glob(str(tmp_path / "logs" / "none_*"))
    stderr_1 = read(os.path.join(run, "attempt_0", "rank_1", "stderr.log"))
    assert stderr_1 == "\n".join(expected_lines("err", 1)) + "\nlast words without a newline"


# The shim: `python script.py` whose rank 0 starts rank 1 (agnostic.launch.local).
SHIM = """import os, sys
from agnostic.launch import local
if "RANK" in os.environ:
    print("stdout of the worker")
    for index in range(20000):  # about 1 MB while rank 0 reads nothing itself
        sys.stderr.write(f"err {index} " + "e" * 40 + "\\n")
    sys.exit(0)
local.launch(2)
print("stdout of rank 0")
print("stderr of rank 0", file=sys.stderr)
"""


def run_shim(folder, name, text):
    """`python NAME` (the script `text`) in `folder`, as users start the shim."""
    (folder / name).write_text(text)
    return subprocess.run([sys.executable, name], cwd=folder, env=environment(folder),
                          capture_output=True, text=True, timeout=120)


def test_the_shims_workers_follow_the_same_convention(tmp_path):
    result = run_shim(tmp_path, "shim.py", SHIM)
    assert result.returncode == 0, result.stderr[-2000:]
    assert lines(result.stdout) == ["stdout of rank 0"]
    said = lines(result.stderr)
    assert "stderr of rank 0" in said
    assert [l for l in said if l.startswith("[rank1]: ")] == [
        f"[rank1]: err {index} " + "e" * 40 for index in range(20000)]
    [folder] = temporary_logs(tmp_path)
    assert (f"agnostic: what the terminal did not show of the output of rank 1 is in "
            f"{folder}: {os.path.join('rank_1', 'stdout.log')}.") in said
    assert read(os.path.join(folder, "rank_1", "stdout.log")) == "stdout of the worker\n"
    assert not os.path.exists(os.path.join(folder, "rank_1", "stderr.log"))  # shown
    assert not glob.glob(str(tmp_path / "agnostic-failures-*"))


# What reaches the terminal and what a file, decided without a process.
@pytest.mark.parametrize("chosen, rank, local_rank, shown, filed", [
    (output.Output(), 0, 0, {"stdout", "stderr"}, set()),
    (output.Output(), 3, 1, {"stderr"}, {"stdout"}),
    (output.Output(tee=1), 3, 1, {"stdout", "stderr"}, set()),
    (output.Output(log_dir="logs"), 0, 0, {"stdout", "stderr"}, {"stdout", "stderr"}),
    (output.Output(local_ranks=frozenset({1})), 0, 0, set(), {"stdout", "stderr"}),
    (output.Output(local_ranks=frozenset({1})), 5, 1, {"stderr"}, {"stdout"}),
])
def test_what_is_shown_and_what_is_filed(chosen, rank, local_rank, shown, filed):
    assert {s for s in output.STREAMS if chosen.shown(rank, local_rank, s)} == shown
    assert {s for s in output.STREAMS if chosen.filed(rank, local_rank, s)} == filed


SHIM_FAILS = """import os, sys, time
from agnostic.launch import local
if "RANK" in os.environ:
    for index in range(2000):
        sys.stderr.write(f"err {index}\\n")
    sys.stderr.write("the worker's last words\\n")
    sys.exit(3)
local.launch(2)
time.sleep(60)  # the worker's failure ends this process
"""


def test_a_failing_shim_worker_has_its_last_lines_shown_before_rank_0_exits(tmp_path):
    result = run_shim(tmp_path, "fails.py", SHIM_FAILS)
    assert result.returncode == 3, result.stderr[-2000:]
    said = lines(result.stderr)
    assert len([l for l in said if l.startswith("[rank1]: err ")]) == 2000
    assert "[rank1]: the worker's last words" in said
    assert "(rank 1 of 2) exited with status 3" in result.stderr
    assert temporary_logs(tmp_path) == []  # everything it wrote was shown


SHIM_WARNS = """import os, sys, warnings
from agnostic.launch import local
if "RANK" in os.environ:
    warnings.warn("a warning only the worker gives")
    sys.stderr.write("an error line of the worker\\n")
    sys.exit(0)
local.launch(2)
warnings.warn("a warning rank 0 gives")
"""


def test_a_shim_workers_warnings_go_to_its_log_file_not_the_terminal(tmp_path):
    # Each worker runs the script in step with rank 0, which shows the same
    # warnings: the workers' are kept in their files, not shown again.
    result = run_shim(tmp_path, "warns.py", SHIM_WARNS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "UserWarning: a warning rank 0 gives" in result.stderr
    assert "a warning only the worker gives" not in result.stderr
    assert "[rank1]: an error line of the worker" in lines(result.stderr)
    [folder] = temporary_logs(tmp_path)  # kept: it holds what was not shown
    filed = read(os.path.join(folder, "rank_1", "stderr.log"))
    assert "UserWarning: a warning only the worker gives\n" in filed
    assert "\x1e" not in filed and "an error line of the worker" not in filed  # shown
    assert (f"agnostic: what the terminal did not show of the output of rank 1 is in "
            f"{folder}: {os.path.join('rank_1', 'stderr.log')}.") in lines(result.stderr)
