"""The reply decoders of gateway/vsphere/soap_scan.py judged against each other: the shape scanner, the
whole decoder and ElementTree give one answer for a reply, or fail alike."""

from __future__ import annotations

from collections.abc import Callable

from gateway.vsphere import soap_scan
from gateway.vsphere.soap_scan import Page


def outcome(decode: Callable[[bytes], Page], body: bytes) -> Page | str:
    """What ``decode`` makes of ``body``: its page, or the name of the exception it raised."""
    try:
        return decode(body)
    except Exception as exc:  # the comparison is the point: both decoders must fail alike
        return type(exc).__name__


def assert_decoders_agree(body: bytes, *, scanned: bool) -> None:
    """``body`` decodes the same through every decoder; the scanner takes it exactly when ``scanned``."""
    fast = soap_scan.scan_retrieve_result(body)
    assert (fast is not None) == scanned
    tree = outcome(soap_scan.parse_retrieve_tree, body)
    assert outcome(soap_scan.parse_retrieve_result, body) == tree
    if fast is not None:
        assert fast == tree
