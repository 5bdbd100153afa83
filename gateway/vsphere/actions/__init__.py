"""Every vSphere mutation the gateway performs, each as a ``plan`` and an ``execute`` function.

One module per family: ``power``, ``snapshots``, ``hardware`` (reconfigure, ISO images, removing a
disk), ``placement`` (migrate, clone), ``removal`` (delete, unregister) and ``bulk``; what they share
lives in ``planning`` (resolving and describing objects, ``_state_after_policy``), ``execution``
(``Execution``: running tasks, translating faults) and ``safety`` (safety snapshots).

``plan_*(session, args) -> Plan`` resolves names to objects and reads the facts policy needs,
validating the arguments against the target (a network, datastore or host that does not exist, a
size out of range, a clone name in use) without changing anything: bad input raises
``errors.InvalidArgument`` naming the field. A VM in the wrong state is never raised out of a plan:
every ``plan_*`` is wrapped by ``_state_after_policy``, which turns an ``errors.InvalidState`` into a
recorded precondition (``Plan.unmet``) on the objects resolved so far, so the pipeline answers it only
after the policy allowed the call (a denied caller never hears about object state).
``Plan.params`` holds moids and plain values only, so another process can execute it later.

``execute_*(session, plan, progress) -> dict`` performs the change, follows every task through
``tasks.wait_for_task`` and returns a result naming the target and the objects. Each task gets
``params["timeout_seconds"]`` to finish: past it a write reports ``timeout`` and a destructive
step ``outcome_unknown`` (never retried).

Rules that hold for every tool here:

- A VM whose ``runtime.connectionState`` is orphaned, inaccessible or invalid is refused (a precondition)
  (vSphere disables nearly everything on such a VM and says only "not allowed in the current
  state"); ``unregister_vm`` is the one exception, since it is how such a record is cleared.
- Safety snapshots: when the pipeline sets ``params["auto_snapshot"]`` on a revert-type tool
  (revert_snapshot, bulk revert_to_current_snapshot, remove_disk without ``delete_files``),
  execute first snapshots every affected VM (``gateway-safety-<UTC time>``) and reports them as
  ``safety_snapshots``. If any of them fails, nothing destructive runs. Deletes never take one:
  the snapshot would be destroyed with the VM or the snapshots it was meant to protect.
- Once an execute has started a mutation, a session expiry is reported, not retried: the session
  pool re-runs a call from the start only while nothing has changed yet.
"""
