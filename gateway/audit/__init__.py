"""The audit trail: everything about audit rows except the decision of when to write one.

Each row is hash-chained to the previous one (``chain``), so editing, deleting or reordering a line
breaks the chain where ``verify`` names it. The chain is unkeyed: whoever can rewrite the whole file
can forge a consistent one, which is what signed checkpoints, witnesses and shipping the rows off the
host (syslog) are for. The Merkle tree over the rows (``merkle``) lets anyone check one row or the
log's growth without the gateway's code.
"""
