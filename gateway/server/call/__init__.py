"""The call path: a call's arrival, the gate, reads and read rules, writes, idempotency keys, busy audit."""
