"""What agnostic's start-up hook costs a Python process that does not use
agnostic: `python -c pass` in this environment, with agnostic installed (its
.pth file runs) and with the hook disabled (the same interpreter, with
site's processing of that one .pth file skipped), without variables and
with a job's variables set, median of many runs in alternating order. For
comparison, the hook before issue 24, which imported the agnostic package
at start whenever a job's variable was set (fewer runs: it parses the
scheduler's variables, seconds for a huge host list).

    python benchmarks/startup.py              # 101 runs of each
    python benchmarks/startup.py --smoke      # seconds: checks it runs

Run it with the environment's interpreter, where agnostic is installed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PTH = "agnostic-cpu-devices.pth"
# Every way starts the same: `python -S`, then site's work by hand.
INSTALLED = "import site; site.main()"
DISABLED = ("import site; add = site.addpackage; site.addpackage = lambda d, n, k: "
            f"k if n == {PTH!r} else add(d, n, k); site.main()")
BEFORE = DISABLED + "; import os; {}".format(
    "any(v in os.environ for v in ('AGNOSTIC_CPU_DEVICES', 'AGNOSTIC_JOIN', 'WORLD_SIZE', "
    "'TF_CONFIG', 'KERAS_DISTRIBUTION_NUM_PROCESSES', 'SLURM_PROCID', "
    "'OMPI_COMM_WORLD_SIZE', 'NUM_PROCESSES', 'JSM_NAMESPACE_SIZE')) and "
    "__import__('agnostic')")
WAYS = {"disabled": DISABLED, "installed": INSTALLED, "before": BEFORE}
SRUN = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"}
CASES = {
    "none": {},
    "TF_CONFIG (a TFJob pod)": {"TF_CONFIG": json.dumps({
        "cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker", "index": 0}})},
    "RANK, WORLD_SIZE": {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": "29500"},
    "srun task, 2 nodes": dict(SRUN, SLURM_JOB_NODELIST="n[1-2]"),
    "srun task, n[0-20000000]": dict(SRUN, SLURM_JOB_NODELIST="n[0-20000000]"),
    "AGNOSTIC_CPU_DEVICES=4": {"AGNOSTIC_CPU_DEVICES": "4"},
}
# Variables of this process that would change what the children do.
CLEARED = ("AGNOSTIC_CPU_DEVICES", "AGNOSTIC_JOIN", "TF_CONFIG", "RANK", "WORLD_SIZE",
           "KERAS_DISTRIBUTION_NUM_PROCESSES", "OMPI_COMM_WORLD_SIZE", "NUM_PROCESSES",
           "JSM_NAMESPACE_SIZE", "TORCHELASTIC_RUN_ID")


def run_once(code, variables, quiet=True):
    """(milliseconds, peak memory in MB) of `python -S -c code`; `quiet`: it
    must print nothing on stderr."""
    env = {key: value for key, value in os.environ.items()
           if key not in CLEARED and not key.startswith("SLURM_")}
    env.update(variables)
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-S", "-c", code], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = 1000 * (time.perf_counter() - began)
    process.returncode = (os.WEXITSTATUS(status) if os.WIFEXITED(status)
                          else -os.WTERMSIG(status))
    errors = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    if process.returncode != 0 or (quiet and errors):
        raise RuntimeError(f"python -S -c {code!r} failed ({process.returncode}):\n{errors}")
    return elapsed, usage.ru_maxrss / 1024  # Linux: kilobytes


def check_installed():
    """Fails unless this interpreter's site-packages holds agnostic's hook."""
    code = INSTALLED + "; import sys; sys.exit('_agnostic_hook' not in sys.modules)"
    env = dict(os.environ, WORLD_SIZE="2")
    if subprocess.run([sys.executable, "-S", "-c", code], env=env).returncode != 0:
        raise SystemExit(f"agnostic's start-up hook is not installed for {sys.executable}: "
                         "run this with the interpreter of an environment where agnostic "
                         "was installed with pip")


def measure(variables, repeats, before_repeats):
    runs = {way: [] for way in WAYS}
    memory = {way: [] for way in WAYS}
    for repeat, order in enumerate(common.rotations(tuple(WAYS), repeats)):
        for way in order:
            if way == "before" and repeat >= before_repeats:
                continue
            milliseconds, megabytes = run_once(WAYS[way], variables, way != "before")
            runs[way].append(milliseconds)
            memory[way].append(megabytes)
    return runs, memory


def table(results):
    rows = ["| variables | hook disabled ms | agnostic installed ms | difference ms | "
            "before issue 24 ms | peak MB (disabled / installed / before) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(
            f"| {r['case']} | {r['disabled_ms']:.1f} | {r['installed_ms']:.1f} | "
            f"{r['installed_ms'] - r['disabled_ms']:+.1f} | {r['before_ms']:.1f} | "
            f"{r['disabled_mb']:.0f} / {r['installed_mb']:.0f} / {r['before_mb']:.0f} |")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=101)
    parser.add_argument("--before-repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(common.ROOT, "benchmarks", "results"))
    parser.add_argument("--smoke", action="store_true", help="a few runs: checks it runs")
    options = parser.parse_args()
    if options.smoke:
        options.repeats, options.before_repeats = 3, 1
        options.out = os.path.join(options.out, "smoke")
    check_installed()
    results = []
    for case, variables in CASES.items():
        runs, memory = measure(variables, options.repeats, options.before_repeats)
        results.append(dict(
            {f"{way}_ms": common.median(runs[way]) for way in WAYS},
            **{f"{way}_mb": max(memory[way]) for way in WAYS},
            case=case, variables=variables, runs=runs))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    common.write(options.out, "startup", results, table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
