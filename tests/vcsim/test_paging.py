"""The launcher pages a large retrieval as vCenter does (deploy/vcsim/overlay/paging.go): at most
``RetrieveOptions.maxObjects`` objects per reply and a token for the rest, continued or cancelled by
token, a token good once and only in the session it was given to. Driven with raw pyVmomi over SOAP/TLS;
``/inflight`` reports how many paged results wait for a continuation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim, vmodl
from support.simulator import MakeSimulator, Simulator, pyvmomi_connect

PC: Any = vmodl.query.PropertyCollector
DISCONNECT: Any = Disconnect  # untyped


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=0, standalone_hosts=1, vms=7, datastores=1)


@pytest.fixture
def view(si: Any) -> Iterator[Any]:
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    yield view
    view.DestroyView()


def _spec(view: Any) -> Any:
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[
            PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)])],
        propSet=[PC.PropertySpec(type=vim.VirtualMachine, pathSet=["name"])])


def _names(result: Any) -> list[str]:
    return [content.propSet[0].val for content in result.objects]


def _pending(sim: Simulator) -> int:
    return int(sim.control("/inflight")["pending_retrievals"])


def test_a_retrieval_comes_in_pages_of_max_objects_until_no_token_is_left(
        sim: Simulator, si: Any, view: Any) -> None:
    collector = si.content.propertyCollector
    whole = collector.RetrievePropertiesEx([_spec(view)], PC.RetrieveOptions())
    assert whole.token is None and len(whole.objects) == 7

    page = collector.RetrievePropertiesEx([_spec(view)], PC.RetrieveOptions(maxObjects=3))
    sizes, names = [len(page.objects)], _names(page)
    assert page.token and _pending(sim) == 1
    while page.token:
        page = collector.ContinueRetrievePropertiesEx(page.token)
        sizes.append(len(page.objects))
        names += _names(page)
    assert sizes == [3, 3, 1]
    assert names == _names(whole)
    assert _pending(sim) == 0


def test_the_page_limit_cuts_every_page_with_or_without_max_objects(
        sim: Simulator, si: Any, view: Any) -> None:
    collector = si.content.propertyCollector
    sim.control("/page-limit", {"max_objects": 2})
    sizes = []
    for options in (PC.RetrieveOptions(), PC.RetrieveOptions(maxObjects=5), PC.RetrieveOptions(maxObjects=1)):
        page = collector.RetrievePropertiesEx([_spec(view)], options)
        sizes.append(len(page.objects))
        collector.CancelRetrievePropertiesEx(page.token)
    sim.control("/reset")
    assert sizes == [2, 2, 1]
    assert len(collector.RetrievePropertiesEx([_spec(view)], PC.RetrieveOptions()).objects) == 7


def test_a_token_is_good_once_and_only_in_its_own_session(sim: Simulator, si: Any, view: Any) -> None:
    collector = si.content.propertyCollector
    first = collector.RetrievePropertiesEx([_spec(view)], PC.RetrieveOptions(maxObjects=2))
    other = pyvmomi_connect(sim)
    try:
        with pytest.raises(vmodl.fault.InvalidArgument):
            other.content.propertyCollector.ContinueRetrievePropertiesEx(first.token)
    finally:
        DISCONNECT(other)
    second = collector.ContinueRetrievePropertiesEx(first.token)  # another session's try used nothing
    assert len(second.objects) == 2 and second.token
    with pytest.raises(vmodl.fault.InvalidArgument):
        collector.ContinueRetrievePropertiesEx(first.token)  # used
    collector.CancelRetrievePropertiesEx(second.token)
    assert _pending(sim) == 0
    with pytest.raises(vmodl.fault.InvalidArgument):
        collector.ContinueRetrievePropertiesEx(second.token)  # cancelled


def test_the_end_of_a_session_drops_its_waiting_results(sim: Simulator) -> None:
    si = pyvmomi_connect(sim)
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    si.content.propertyCollector.RetrievePropertiesEx([_spec(view)], PC.RetrieveOptions(maxObjects=2))
    assert _pending(sim) == 1
    DISCONNECT(si)
    assert _pending(sim) == 0
