"""Everything that talks to vSphere, and the only package that imports pyVmomi.

``Scheduler`` (per-target fair slots, see ``lane``, and worker threads) hands each call a
``VSphereSession`` from that target's ``SessionPool``; ``faults.translate`` turns what pyVmomi raises
into gateway errors.
"""

from gateway.vsphere.pool import PoolStats, SessionPool, VSphereSession
from gateway.vsphere.scheduler import Scheduler

__all__ = ["PoolStats", "Scheduler", "SessionPool", "VSphereSession"]
