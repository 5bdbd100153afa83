"""The audit trail: everything about audit rows except the decision of when to write one.

Modules: ``redact`` (masking secrets in every text and value that leaves the process), ``bounds``
(the row's size bounds), ``chain`` (a row's canonical bytes, hash and stamps), ``signing`` (Ed25519
checkpoints of the chain's head), ``files`` (the JSONL log's files and reading them), ``file_sink``
(appending, rotation, retention, the lock file), ``pg_sink`` and ``pg_reader`` (the chain in a
PostgreSQL table), ``verify`` (walking the chain and its checkpoints), ``query`` (rows by filter,
counts), ``readers`` (one reading interface for either place) and ``metrics`` (Prometheus families).
"""
