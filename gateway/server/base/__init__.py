"""The shared base of the wings: call context, facts now, audit trail, moves, metrics, reloads."""
