"""agnostic's start-up hook: the wheel installs this file beside the package,
as the top-level module `_agnostic_hook`, which agnostic-cpu-devices.pth
imports as Python starts when one of agnostic's or a scheduler's variables
is set (agnostic._startup imports it too, for names_agnostic).

At start-up it only puts a finder on sys.meta_path: it imports nothing,
reads no variable's value and never raises or prints. When the program
imports an engine (tensorflow, jax, torch), the finder decides once: only a
program whose main script (`-m` module, `-c` code) imports agnostic, or one
run with AGNOSTIC_JOIN=1, imports agnostic there, so that agnostic sets the
engine up as it is imported (agnostic/_startup.py says why). Any other
program runs exactly as without agnostic.
"""
import sys

ENGINES = ("tensorflow", "jax", "torch")
# Not empty while this hook imports agnostic (agnostic/__init__.py asks).
IMPORTING = []
_IMPORTS_AGNOSTIC = (
    r"\b(?:from\s+agnostic\b|import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*agnostic\b)")


def names_agnostic():
    """Whether the program that runs imports agnostic, read from its source:
    the main script's file, or the `-c` code on the command line."""
    import re

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        if path:
            with open(path, encoding="utf-8", errors="replace") as handle:
                source = handle.read()
        else:
            source = " ".join(getattr(sys, "orig_argv", sys.argv))
    except (OSError, TypeError, ValueError):
        return False
    return re.search(_IMPORTS_AGNOSTIC, source) is not None


# AGNOSTIC_WARNINGS=log (set by agnostic for the workers it starts, whose
# rank 0 shows the same warnings): each line of this process's Python
# warnings starts with WARNING_MARK, which the reader of its stderr in rank 0
# (agnostic/launch/output.py, the same mark) takes as "to the log file only".
WARNINGS_VARIABLE = "AGNOSTIC_WARNINGS"
WARNING_MARK = "\x1eagnostic-log-only\x1e"


def warnings_to_log():
    """This worker's Python warnings go to its log file, not the terminal
    (once per process; nothing is dropped)."""
    import warnings

    if getattr(warnings.showwarning, "to_log", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line)
        try:
            (file or sys.stderr).write(
                "".join(WARNING_MARK + part for part in text.splitlines(True)))
        except (AttributeError, OSError, ValueError):  # no stderr: as Python does
            pass

    show.to_log = True
    warnings.showwarning = show


def in_a_child_process():
    """Whether this is a multiprocessing child (spawn, forkserver) running
    the parent's main script again as __mp_main__: the job's variables that
    it inherits describe its parent."""
    return getattr(sys.modules.get("__main__"), "__name__", None) == "__mp_main__"


def _wanted():
    import os

    if "agnostic" in sys.modules:  # the program imported it: it set up already
        return False
    if in_a_child_process():
        return False
    if os.environ.get("AGNOSTIC_JOIN", "").strip() == "1":
        return True
    return names_agnostic()


class _EngineImport:
    """Meets the program's first import of an engine, then stands aside."""

    def __init__(self):
        self.decided = False

    def find_spec(self, name, path=None, target=None):
        if self.decided or name not in ENGINES:
            return None
        self.decided = True
        try:
            if not _wanted():
                return None
            import importlib

            IMPORTING.append(name)
            try:
                # By name, as a plugin is loaded: the hook imports nothing of
                # agnostic's itself. Importing agnostic installs its set-up.
                importlib.import_module("agnostic")
            finally:
                del IMPORTING[:]
            # The engine's spec with agnostic's set-up after it executes.
            for finder in sys.meta_path:
                if getattr(finder, "AGNOSTIC_SET_UP", False):
                    return finder.find_spec(name, path, target)
            return None
        except Exception:  # a broken install: the program's own import says so
            return None


if __name__ == "_agnostic_hook":
    try:
        if not any(isinstance(f, _EngineImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _EngineImport())
        import os

        if os.environ.get(WARNINGS_VARIABLE) == "log":
            warnings_to_log()
    except Exception:
        pass
