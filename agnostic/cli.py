"""The `agnostic` command: `agnostic info`, `agnostic launch`."""
import argparse
import json
import logging
import sys


def info(as_json=False, out=sys.stdout):
    """Prints the environment report (agnostic/report.py): the machine, the
    engines and the GPUs each sees, the plan. 1 when no plan can be made."""
    from agnostic import report

    gathered = report.gather()
    print(json.dumps(gathered, indent=2) if as_json else report.text(gathered), file=out)
    return 0 if report.succeeded(gathered) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="agnostic",
        description="One Keras training script on every device and engine.",
    )
    from agnostic import __version__

    parser.add_argument("--version", action="version", version=f"agnostic {__version__}")
    commands = parser.add_subparsers(dest="command")
    info_parser = commands.add_parser(
        "info", help="an environment report to paste into a bug report: the machine, "
                     "its GPUs, each engine and what it sees, the plan")
    info_parser.add_argument("--json", action="store_true",
                             help="the same report as JSON (default: text)")
    _add_launch(commands)
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if arguments.command == "info":
        return info(arguments.json)
    if arguments.command == "launch":
        return _launch(arguments)
    parser.print_help()
    return 2


LAUNCH_EXAMPLES = """examples:
  agnostic launch --nproc-per-node auto train.py --epochs 10
  agnostic launch --standalone --nproc-per-node 2 -m mypkg.train --lr 0.1
  # every process's output in files under ./logs, and every rank's on the terminal:
  agnostic launch --nproc-per-node 4 --log-dir ./logs --tee 3 train.py
  # start every process again when one fails, up to 3 times (BackupAndRestore resumes):
  agnostic launch --nproc-per-node 4 --max-restarts 3 train.py
  # two nodes: a secret both can read, then this command on each with its own --node-rank:
  (umask 077; python -c 'import secrets; print(secrets.token_hex(32))' > ~/.agnostic-job-secret)
  agnostic launch --nproc-per-node 4 --nnodes 2 --node-rank 0 \\
      --master-addr 10.0.0.1 --master-port 29500 --secret-file ~/.agnostic-job-secret train.py

output: rank 0's reaches the terminal as it is; every other rank's standard error
too, each line starting with [rank<r>]:, and its standard output goes to a file
(under --log-dir, else in a folder of the temp dir, named at the end if kept).
"""


def _add_launch(commands):
    """`agnostic launch`, with torchrun's flags (both spellings: --nproc-per-node
    and --nproc_per_node). Values stay strings: launch.settings checks them."""
    from agnostic.launch import settings

    launch = commands.add_parser(
        "launch", help="start a script's processes on this node (one per device)",
        description="Start N processes of a script on this node, with the variables "
                    "each engine's distributed runtime reads (torch, TF_CONFIG, JAX).",
        epilog=LAUNCH_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                        metavar="N", default="1",
                        help=f"processes on this node: a whole number, or {settings.AUTO} "
                             "(default: %(default)s)")
    launch.add_argument("--nnodes", metavar="M", default="1",
                        help="nodes (machines), each running this command; torchrun's "
                             "MIN:MAX only as M:M, elastic counts are not supported "
                             "(default: %(default)s)")
    launch.add_argument("--node-rank", "--node_rank", dest="node_rank", metavar="R",
                        default="0", help="this node's rank, 0 to M-1; node 0 is the "
                                          "master (default: %(default)s)")
    launch.add_argument("--master-addr", "--master_addr", dest="master_addr",
                        metavar="HOST", help="node 0's address, reachable from every "
                        f"node (default: {settings.DEFAULT_MASTER_ADDR})")
    launch.add_argument("--master-port", "--master_port", dest="master_port",
                        metavar="PORT", help="free port on node 0 where the launchers "
                        "meet; the launcher also uses PORT+1 (torch) and PORT+2 (JAX) "
                        f"there (default: {settings.DEFAULT_MASTER_PORT}, torchrun's)")
    launch.add_argument("--master", metavar="HOST:PORT",
                        help="the same as --master-addr HOST --master-port PORT; an "
                             "IPv6 address in brackets: [::1]:29500 (default: not set)")
    launch.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint",
                        metavar="HOST:PORT", help="torchrun's name for --master "
                                                  "(default: not set)")
    launch.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend",
                        metavar="NAME", help="static or c10d, both meaning agnostic's "
                        "own rendezvous at the master; others are refused (default: "
                        "static)")
    launch.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", metavar="ID",
                        help="the run's name: its log folder under --log-dir starts "
                             f"with it (default: {settings.DEFAULT_RUN_ID})")
    launch.add_argument("--max-restarts", "--max_restarts", dest="max_restarts",
                        metavar="N", help="when a process fails, stop this node's "
                        "processes and start them all again, up to N times; one node "
                        "only (default: 0)")
    launch.add_argument("--log-dir", "--log_dir", dest="log_dir", metavar="DIR",
                        help="write every process's stdout and stderr to files, "
                             "DIR/<rdzv-id>_<unique>/attempt_<n>/rank_<r>/stdout.log and "
                             "stderr.log (default: only what the terminal does not "
                             "show, in a folder of the temp dir)")
    launch.add_argument("--tee", metavar="{0,1,2,3}",
                        help="besides the log files, show on the terminal: 1 every "
                             "rank's stdout too, 2 stderr (shown anyway), 3 both "
                             "(default: 0, rank 0's output and the others' stderr)")
    launch.add_argument("--local-ranks-filter", "--local_ranks_filter",
                        dest="local_ranks_filter", metavar="RANKS",
                        help="show only these local ranks' output on the terminal, such "
                             "as 0 or 0,2; the rest stays in the log files (default: all)")
    launch.add_argument("--standalone", action="store_true",
                        help="a single node, its master on 127.0.0.1 at a free port, "
                             "so that several runs can share a machine (default: off)")
    launch.add_argument("--secret-file", "--secret_file", dest="secret_file", metavar="PATH",
                        help="with --nnodes > 1: a file only you can read (chmod 600) "
                             "holding the job's secret, the same on every node; the "
                             "launchers prove it to each other (default: "
                             "AGNOSTIC_JOB_SECRET_FILE, else AGNOSTIC_JOB_SECRET)")
    launch.add_argument("--listen-addr", "--listen_addr", dest="listen_addr",
                        metavar="ADDRESS",
                        help="node 0 only: the address its launcher listens on; 0.0.0.0 "
                             "is every interface, only for a network you trust (default: "
                             "the master address)")
    launch.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module name, run as `python -m SCRIPT` "
                             "(default: off, SCRIPT is a file)")
    launch.add_argument("script", metavar="SCRIPT",
                        help="the Python file each process runs (a module with -m)")
    launch.add_argument("arguments", metavar="ARGS", nargs=argparse.REMAINDER,
                        help="the script's own arguments, passed on unchanged")


def _launch(arguments):
    from agnostic import errors
    from agnostic.launch import nodes, settings

    command = (["-m"] if arguments.module else []) + [arguments.script] + arguments.arguments
    try:
        checked = settings.settings(
            arguments.nproc_per_node, arguments.nnodes, arguments.node_rank,
            arguments.master, arguments.master_addr, arguments.master_port,
            arguments.standalone, **{name: getattr(arguments, name) for name in (
                "rdzv_endpoint", "rdzv_backend", "rdzv_id", "max_restarts", "log_dir",
                "tee", "local_ranks_filter")})
        given = {name: getattr(arguments, name) for name in ("secret_file", "listen_addr")
                 if getattr(arguments, name) is not None}
        return nodes.run(command, checked, **given)
    except errors.LaunchError as error:
        print(f"agnostic launch: {error}", file=sys.stderr)
        return 2
