"""Every vSphere mutation the gateway performs, each as a ``plan`` and an ``execute`` function.

- A plan resolves names and reads the facts policy needs without changing anything; a VM in the wrong
  state is recorded as ``Plan.unmet`` (``_state_after_policy``), never raised, so a caller the policy
  denies never hears about object state. ``Plan.params`` holds plain values, executable later elsewhere.
- Past a task's deadline a write reports ``timeout`` and a destructive step ``outcome_unknown``, never
  retried; once a mutation has started, a session expiry is reported, not retried.
- An orphaned, inaccessible or invalid VM is refused (vSphere only says "not allowed"), except by
  ``unregister_vm``, which is how such a record is cleared.
- Safety snapshots are all or nothing; deletes never take one (it would go with what it protects).
"""
