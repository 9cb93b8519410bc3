"""The `agnostic` command: `agnostic info`, `agnostic launch`."""
import argparse
import logging
import sys

ENGINES = ("keras", "tensorflow", "jax", "jaxlib", "torch", "mxnet")
# The distributions each engine may come from, in the order asked.
DISTRIBUTIONS = {"keras": ("keras", "keras-nightly", "keras-mxnet"),
                 "tensorflow": ("tensorflow", "tensorflow-cpu")}


def _version(name):
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def info(out=sys.stdout):
    """Prints the backend, engine versions, devices and the plan."""
    from agnostic import errors, plan

    from agnostic import devices as devices_lib

    print(f"python: {sys.version.split()[0]}", file=out)
    engine, source = devices_lib.backend_source()
    print(f"engine: {engine} ({source}; switch with KERAS_BACKEND=...)", file=out)
    for name in ENGINES:
        version = next(filter(None, map(_version, DISTRIBUTIONS.get(name, (name,)))), None)
        if name == "keras":
            from agnostic import devices
            from agnostic.compat import versions

            described = versions.describe(version, devices.configured_backend())
            print(f"keras: {described}", file=out)
        else:
            print(f"{name}: {version or 'not installed'}", file=out)
    try:
        chosen = plan.resolve()
    except errors.AgnosticError as error:
        print(f"plan: unavailable: {error}", file=out)
        return 1
    print(f"backend: {chosen.backend}", file=out)
    print(f"environment: {chosen.environment}", file=out)
    print(f"plan: strategy={chosen.strategy} replicas={chosen.num_replicas} "
          f"processes={chosen.num_processes} process_id={chosen.process_id} "
          f"devices=[{', '.join(chosen.devices)}]", file=out)
    print(f"reason: {chosen.reason}", file=out)
    if chosen.fallback_warning:  # what backend_agnostic_compile would warn
        print(f"warning: {chosen.fallback_warning}", file=out)
    from agnostic import placement

    listing = devices_lib.list_devices(chosen.backend)
    print(f"placements: {placement.describe(chosen.backend, listing)}", file=out)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="agnostic",
        description="One Keras training script on every device and engine.",
    )
    from agnostic import __version__

    parser.add_argument("--version", action="version", version=f"agnostic {__version__}")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("info", help="backend, engine versions, devices and the plan")
    _add_launch(commands)
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if arguments.command == "info":
        return info()
    if arguments.command == "launch":
        return _launch(arguments)
    parser.print_help()
    return 2


LAUNCH_EXAMPLES = """examples:
  agnostic launch --nproc-per-node auto train.py --epochs 10
  agnostic launch --standalone --nproc-per-node 2 -m mypkg.train --lr 0.1
  # two nodes: a secret both can read, then this command on each with its own --node-rank:
  (umask 077; python -c 'import secrets; print(secrets.token_hex(32))' > ~/.agnostic-job-secret)
  agnostic launch --nproc-per-node 4 --nnodes 2 --node-rank 0 \\
      --master-addr 10.0.0.1 --master-port 29400 --secret-file ~/.agnostic-job-secret train.py
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
                        help="nodes (machines), each running this command "
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
                        f"there (default: {settings.DEFAULT_MASTER_PORT})")
    launch.add_argument("--master", metavar="HOST:PORT",
                        help="the same as --master-addr HOST --master-port PORT "
                             "(default: not set)")
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
            arguments.standalone)
        given = {name: getattr(arguments, name) for name in ("secret_file", "listen_addr")
                 if getattr(arguments, name) is not None}
        return nodes.run(command, checked, **given)
    except errors.LaunchError as error:
        print(f"agnostic launch: {error}", file=sys.stderr)
        return 2
