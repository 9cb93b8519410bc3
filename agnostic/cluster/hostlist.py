"""SLURM's compact host lists, read without expanding them:
"n[1-3,5],gpu[01-02]" names n1, n2, n3, n5, gpu01, gpu02; brackets may
repeat within a name ("rack[1-2]-n[1-2]": rack1-n1, rack1-n2, rack2-n1,
rack2-n2); commas separate names outside brackets and ranges inside them; a
range keeps the zero padding of its first number ("01-10": 01 ... 10).

`parse` checks the syntax and counts the hosts (refusing more than
MAX_HOSTS) in time linear in the text; the names are made only when asked
for, one at a time.
"""
import re

from agnostic import errors

MAX_HOSTS = 100_000
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_NAME = re.compile(r"[^\[\],\s]*")


class HostList:
    """A parsed host list: len(), [i], iteration and first, without a list
    of every name."""

    def __init__(self, pieces, count):
        self._pieces = pieces  # per name: [text, [(first, last, width)...], text, ...]
        self._count = count

    def __len__(self):
        return self._count

    def __iter__(self):
        for parts in self._pieces:
            yield from _names(parts[0], parts[1:])

    def first(self):
        return self[0]

    def __getitem__(self, index):
        """The index-th name, worked out without making the others."""
        if not 0 <= index < self._count:
            raise IndexError(index)
        for parts in self._pieces:
            brackets = parts[1::2]
            size = _size(brackets)
            if index >= size:
                index -= size
                continue
            name = parts[0]
            for position, ranges in enumerate(brackets):
                below = _size(brackets[position + 1:])
                name += _nth(ranges, index // below) + parts[2 * position + 2]
                index %= below
            return name
        raise IndexError(index)


def _names(prefix, rest):
    """Every name from `prefix` and the [ranges, text, ranges, text...] after it."""
    if not rest:
        yield prefix
        return
    for first, last, width in rest[0]:
        for number in range(first, last + 1):
            yield from _names(f"{prefix}{number:0{width}d}{rest[1]}", rest[2:])


def _size(brackets):
    size = 1
    for ranges in brackets:
        size *= sum(last - first + 1 for first, last, _ in ranges)
    return size


def _nth(ranges, index):
    for first, last, width in ranges:
        if index <= last - first:
            return f"{first + index:0{width}d}"
        index -= last - first + 1
    raise IndexError(index)


def parse(text, variable, limit=MAX_HOSTS):
    """`text` (the value of `variable`) as a HostList; LaunchError naming
    the variable, the value and the syntax for anything malformed, and for
    a list of more than `limit` hosts."""
    def fail(problem):
        raise errors.LaunchError(
            f"{variable} is not a SLURM host list: {problem}. Expected names and "
            "bracketed ranges separated by commas, such as n[1-4,7],gpu[01-02]. "
            f"Received: {variable}={_shown(text)}. SLURM sets it in every task; "
            "unset it, or correct it, if it was set by hand."
        )

    if not text.strip():
        fail("it is empty")
    pieces, count, position, text = [], 0, 0, text.strip()
    while True:
        parts, product = [], 1
        while True:
            name = _NAME.match(text, position).group()
            parts.append(name)
            position += len(name)
            if position == len(text) or text[position] != "[":
                break
            close = text.find("]", position)
            if close < 0:
                fail(f"the bracket at character {position + 1} is never closed")
            ranges, size = _ranges(text[position + 1:close], fail)
            parts.append(ranges)
            product *= size
            position = close + 1
        if len(parts) == 1 and not parts[0]:
            fail(f"an empty host name at character {position + 1}")
        count += product
        if count > limit:
            fail(f"it names more than {limit:,} hosts")
        pieces.append(parts)
        if position == len(text):
            return HostList(pieces, count)
        if text[position] != ",":
            fail(f"{text[position]!r} at character {position + 1} is out of place")
        position += 1
        if position == len(text):
            fail("it ends with a comma")


def _ranges(inside, fail):
    ranges, size = [], 0
    for part in inside.split(","):
        found = _RANGE.fullmatch(part.strip())
        if found is None:
            fail(f"[{inside}] holds {part!r}, not a number or a range such as 1-4")
        first = int(found.group(1))
        last = int(found.group(2)) if found.group(2) is not None else first
        if last < first:
            fail(f"the range {part} runs backwards")
        ranges.append((first, last, len(found.group(1))))
        size += last - first + 1
    return ranges, size


def parse_counts(text, variable):
    """SLURM's tasks per node, "2(x3),1", as [(tasks, nodes), ...] runs."""
    runs = []
    for part in text.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            raise errors.LaunchError(
                f"{variable} is not SLURM's count of tasks per node: {part!r} is out of "
                "place. Expected counts such as 2(x3),1 (two tasks on each of three "
                f"nodes, then one). Received: {variable}={_shown(text)}. SLURM sets it in "
                "every task; unset it, or correct it, if it was set by hand."
            )
        runs.append((int(found.group(1)), int(found.group(2) or 1)))
    return runs


def _shown(text, limit=200):
    return repr(text if len(text) <= limit else text[:limit] + "...")
