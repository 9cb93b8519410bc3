"""The `agnostic` command: `agnostic info`."""
import argparse
import logging
import sys

ENGINES = ("keras", "tensorflow", "jax", "jaxlib", "torch", "mxnet")


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
    from agnostic import devices, errors, plan

    print(f"python: {sys.version.split()[0]}", file=out)
    for name in ENGINES:
        distribution = {"tensorflow": "tensorflow-cpu"}.get(name, name)
        version = _version(name) or _version(distribution) or (
            _version("tensorflow") if name == "tensorflow" else None
        )
        print(f"{name}: {version or 'not installed'}", file=out)
    try:
        backend = devices.current_backend()
        listing = devices.list_devices(backend)
        chosen = plan.decide(backend, listing)
    except errors.AgnosticError as error:
        print(f"plan: unavailable: {error}", file=out)
        return 1
    print(f"backend: {backend}", file=out)
    print(f"devices: {', '.join(listing.devices)}", file=out)
    print(f"plan: strategy={chosen.strategy} replicas={chosen.num_replicas} "
          f"processes={chosen.num_processes} process_id={chosen.process_id} "
          f"devices=[{', '.join(chosen.devices)}]", file=out)
    print(f"reason: {chosen.reason}", file=out)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="agnostic",
        description="One Keras training script on every device and engine.",
    )
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("info", help="backend, engine versions, devices and the plan")
    launch = commands.add_parser(
        "launch", help="start a script's processes on this node (one per device)",
        description="Start N processes of a script on this node, with the variables "
                    "each engine's distributed runtime reads (torch, TF_CONFIG, JAX).")
    launch.add_argument("--nproc-per-node", type=int, required=True)
    launch.add_argument("--nnodes", type=int, default=1)
    launch.add_argument("--node-rank", type=int, default=0)
    launch.add_argument("--master", default="127.0.0.1:29400",
                        help="HOST:PORT of node 0; the launcher also uses PORT+1 "
                             "(torch) and PORT+2 (JAX) on that host")
    launch.add_argument("script")
    launch.add_argument("arguments", nargs=argparse.REMAINDER)
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if arguments.command == "info":
        return info()
    if arguments.command == "launch":
        from agnostic import errors
        from agnostic.launch import nodes

        try:
            return nodes.run([arguments.script] + arguments.arguments,
                             arguments.nproc_per_node, arguments.nnodes,
                             arguments.node_rank, arguments.master)
        except errors.LaunchError as error:
            print(f"agnostic launch: {error}", file=sys.stderr)
            return 2
    parser.print_help()
    return 2
