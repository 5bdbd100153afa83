"""The audit trail: everything about audit rows except the decision of when to write one.

One line per tool call and per lifecycle event. Every row is stamped with ``ts`` (UTC, ms),
``ts_epoch`` (the same instant in seconds), ``seq`` (1, 2, 3, ... across rotated files), ``prev``
(the previous row's hash; ``GENESIS`` for the first)
and ``hash``: the SHA-256 of the row's canonical JSON (sorted keys, compact, ASCII) without ``hash``.
Editing, deleting, reordering or inserting a line breaks the chain at that line, which ``verify``
names. The chain is unkeyed: it proves the file is internally consistent, not who wrote it. Someone
able to rewrite the whole file from the edit onwards can forge a consistent one, so ship the lines
off the host (any log pipeline can tail the file) when that matters.

Modules: ``redact`` (masking secrets in every text and value that leaves the process), ``bounds``
(the row's size bounds), ``chain`` (a row's canonical bytes, hash and stamps), ``signing`` (Ed25519
checkpoints of the chain's head), ``files`` (the JSONL log's files and reading them), ``file_sink``
(appending, rotation, retention, the lock file), ``schedule`` (the timer that signs the head when no
row comes), ``phrasing`` (credentials as people write them, for ``redact``), ``pg_sink`` and
``pg_reader`` (the chain in a PostgreSQL table), ``verify`` (walking the chain and its
checkpoints), ``query`` (rows by filter, counts), ``readers`` (one reading interface for either
place) and ``metrics`` (Prometheus families).

The Merkle tree over the rows (RFC 6962), so anyone can check one row or one log's growth without the
gateway's code: ``merkle`` (the pure tree math), ``tree_file`` and ``pg_tree`` (the stored subtree
hashes beside the file, in the table), ``note`` (C2SP signed notes and checkpoints), ``witness``
(publishing checkpoints to witnesses and checking a log against what they saw), ``tree_check`` (the
tree side of verification), ``proofs`` (inclusion and consistency proofs, checked offline) and
``pg_retention`` (dropping old table rows while their hashes keep the rest provable).
"""
