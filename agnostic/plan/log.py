"""The plan line: logged once, by the chief, through the "agnostic" logger,
with the plan's warnings."""
import logging
import os
import sys
import warnings

from agnostic import errors

logger = logging.getLogger("agnostic")

# Set (to anything but 0) to keep the plan line off the terminal; configuring
# the "agnostic" logger (its level or handlers) does too.
QUIET_VARIABLE = "AGNOSTIC_QUIET"


def _visible():
    """The plan line reaches the terminal by default (stderr), once per
    process, as Lightning's first lines do: the "agnostic" logger, left
    unconfigured, is set to INFO and, where no handler would take its
    records, given one. AGNOSTIC_QUIET=1, or any level or handler the
    program gave that logger, decides instead."""
    if os.environ.get(QUIET_VARIABLE, "").strip() not in ("", "0"):
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Prefixed())
        logger.addHandler(handler)


class _Prefixed(logging.Formatter):
    """Each record as "agnostic: <message>" (once: some messages say it)."""

    def format(self, record):
        message = super().format(record)
        return message if message.startswith("agnostic") else f"agnostic: {message}"


def announce(plan):
    """Logs the plan once and gives its fallback warning, if it has one.

    Only the chief (process 0) speaks: the other processes say nothing.
    """
    if plan.process_id != 0:
        return
    _visible()
    # Short: the engine, the strategy and the devices. Why, and the threads,
    # at DEBUG; one device's warning says why, once.
    why = " (why: the SingleDeviceWarning below)" if plan.fallback_warning else ""
    logger.info(plan.line() + why)
    logger.debug("the plan in full: %s", plan.describe())
    if plan.fallback_warning:
        warnings.warn(plan.fallback_warning, errors.SingleDeviceWarning, stacklevel=3)
    if plan.placement_warning:
        warnings.warn(plan.placement_warning, errors.PlacementWarning, stacklevel=3)
