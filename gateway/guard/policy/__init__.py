"""The rules file: its model, how a call is decided against it, parsing, the file followed on disk,
the per-read filter, and the ``gateway policy show`` rendering, one concern a module."""
