"""One gateway process: the composition root over its wings (base, call, proposals, edge)."""
