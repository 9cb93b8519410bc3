"""Runs a command once per tox environment: `python once.py MARKER -- COMMAND...`.

tox runs an environment's `extra_setup_commands` at each of its runs, and
`.ci/run` prepares an environment in one run (`--notest`) and tests it in
the next; the installs beside it (tox.ini's [digits], [example],
[keras_hub]) are made in the first. MARKER, a file in the environment's
folder, holds the command it ran; the command runs again wherever the marker
is missing, unreadable or names another command, and the marker is written
only once the command has succeeded.
"""

import os
import subprocess
import sys


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        sys.exit(f"usage: once.py MARKER -- COMMAND...; received {argv!r}")
    marker, command = argv[0], argv[2:]
    wanted = "\0".join(command)
    try:
        with open(marker, encoding="utf-8") as held:
            if held.read() == wanted:
                return 0
    except (OSError, UnicodeError):
        pass
    code = subprocess.call(command)
    if code == 0:
        partial = f"{marker}.{os.getpid()}"
        with open(partial, "w", encoding="utf-8") as written:
            written.write(wanted)
        os.replace(partial, marker)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
