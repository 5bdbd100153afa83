"""Everything that talks to vSphere, and the only package that imports pyVmomi."""

from gateway.vsphere.pool import PoolStats, SessionPool, VSphereSession
from gateway.vsphere.scheduler import Scheduler

__all__ = ["PoolStats", "Scheduler", "SessionPool", "VSphereSession"]
