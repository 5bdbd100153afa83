"""``Metrics``: label values never come from a caller (a name that is not configured counts as
``unknown``), two gateways in one process never share a family, and a collector that raises is skipped."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from gateway.server.base.metrics import Metrics, gauge_family


def test_labels_are_configured_names_or_unknown() -> None:
    metrics = Metrics(targets=["vc1", "vc2"], tools=["list_vms"])
    metrics.observe_call("list_vms", "vc1", "ok", 0.1)
    metrics.observe_call("list_vms", "vc1,vc2", "ok", 0.1)
    metrics.observe_call("made_up_tool", "evil\nhost", "whatever", 0.1)
    text = metrics.render()
    assert 'gateway_tool_calls_total{outcome="ok",target="vc1",tool="list_vms"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="ok",target="several",tool="list_vms"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="unknown",target="unknown",tool="unknown"} 1.0' in text
    assert "made_up_tool" not in text and "evil" not in text


def test_refusal_and_auth_reasons_come_from_fixed_sets() -> None:
    metrics = Metrics()
    metrics.refusal("no-such-reason")
    metrics.auth_failure("no-such-reason")
    text = metrics.render()
    assert 'gateway_http_refusals_total{reason="unknown"} 1.0' in text
    assert 'gateway_auth_failures_total{reason="unknown"} 1.0' in text


def test_two_gateways_in_one_process_count_apart() -> None:
    one, two = Metrics(targets=["vc1"], tools=["list_vms"]), Metrics(targets=["vc1"], tools=["list_vms"])
    one.observe_call("list_vms", "vc1", "ok", 0.1)
    assert 'tool="list_vms"} 1.0' in one.render() and 'tool="list_vms"} 1.0' not in two.render()


def test_collectors_run_at_each_scrape_and_one_that_raises_is_skipped() -> None:
    metrics = Metrics()
    depth = {"vc1": 1.0}
    metrics.add_collector("queues", lambda: [gauge_family("gateway_test_depth", "depth", "target", depth)])
    metrics.add_collector("broken", lambda: [1 / 0])  # type: ignore[list-item]
    assert 'gateway_test_depth{target="vc1"} 1.0' in metrics.render()
    depth["vc1"] = 4.0
    assert 'gateway_test_depth{target="vc1"} 4.0' in metrics.render()


def test_a_collector_added_again_under_its_name_replaces_the_first() -> None:
    metrics = Metrics()
    metrics.add_collector("q", lambda: [GaugeMetricFamily("gateway_test_a", "a", value=1.0)])
    metrics.add_collector("q", lambda: [GaugeMetricFamily("gateway_test_b", "b", value=2.0)])
    text = metrics.render()
    assert "gateway_test_b 2.0" in text and "gateway_test_a" not in text


def test_a_call_counted_again_after_a_reload_takes_the_names_known_now() -> None:
    metrics = Metrics(targets=["vc1"], tools=["list_vms"])
    metrics.observe_call("list_vms", "vc2", "ok", 0.01)  # vc2 is not configured yet: unknown
    metrics.known(targets=["vc1", "vc2"])
    metrics.observe_call("list_vms", "vc2", "ok", 0.01)
    metrics.observe_call("list_vms", "vc2", "ok", 0.01)
    text = metrics.render()
    assert 'gateway_tool_calls_total{outcome="ok",target="unknown",tool="list_vms"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="ok",target="vc2",tool="list_vms"} 2.0' in text
    assert 'gateway_tool_call_duration_seconds_count{tool="list_vms"} 3.0' in text
