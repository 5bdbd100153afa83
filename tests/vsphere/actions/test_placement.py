"""gateway.vsphere.actions.placement: migration and cloning need a vCenter."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway import errors
from gateway.config import Target
from gateway.vsphere.actions.placement import require_vcenter


def session(api_type: str | None) -> Any:
    about = SimpleNamespace(apiType=api_type) if api_type is not None else SimpleNamespace()
    return SimpleNamespace(target=Target("esx1", "esx1.example", "ESX1"),
                           content=SimpleNamespace(about=about))


def test_a_vcenter_may_migrate() -> None:
    assert require_vcenter(session("VirtualCenter"), "migration") is None


@pytest.mark.parametrize("api_type", ["HostAgent", None, ""])
def test_a_standalone_host_may_not(api_type: str | None) -> None:
    with pytest.raises(errors.NotSupported) as raised:
        require_vcenter(session(api_type), "cloning")
    assert raised.value.code == "not_supported"
    assert raised.value.message == ("target 'esx1' is a standalone ESXi host; cloning needs a vCenter. Run "
                                    "it on the target for the vCenter that manages this host")
    assert raised.value.details == {"target": "esx1"}
