"""Exposure between all and read-only: ``--read-only --allow-write a,b`` offers every read and those writes.

Only write tools can be named (destructive ones stay behind ``--enable-destructive``); any other name
stops ``serve`` with the valid names. Roles and rules still decide each call.
"""

from __future__ import annotations

from gateway.tools.write import WRITE_TOOLS


def write_tool_names() -> tuple[str, ...]:
    """The names ``--allow-write`` accepts, sorted."""
    return tuple(sorted(spec.name for spec in WRITE_TOOLS))


def allow_write_names(raw: str, source: str = "--allow-write") -> tuple[str, ...]:
    """``"a, b,"`` as ``("a", "b")`` (order kept, repeats dropped); ``ValueError`` naming the valid
    names (and ``source``, the flag or variable it came from) when one is not a write tool or none is
    given. Pure."""
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    valid = write_tool_names()
    wrong = [n for n in names if n not in valid]
    if not names or wrong:
        what = f"{wrong[0]!r} is not a write tool of this gateway" if wrong else "no tool named"
        raise ValueError(f"{what}; {source} takes a comma-separated list of: {', '.join(valid)}")
    return names


def allow_write_arg(raw: str) -> tuple[str, ...]:
    """The argparse ``type`` of ``--allow-write``: a wrong name is a usage error (exit 2)."""
    import argparse

    try:
        return allow_write_names(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
