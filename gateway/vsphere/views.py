"""Container views kept per vSphere session, so a sweep does not make and destroy one every time.

Making a view costs the server a walk of the inventory, and a view follows the inventory as it
changes, so each session keeps its views (at most ``LIMIT``, least recently used dropped). A new login
forgets them; a view the server no longer knows is forgotten and the sweep retried once. No lock: a
cache is used by the one thread its session is lent to.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Final

LIMIT: Final = 16
"""Views one session keeps (the gateway's sweeps use a dozen distinct sets of types at most)."""

_Key = tuple[str, tuple[str, ...]]


class ViewCache:
    """The container views one session made, by root and types (see the module)."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._views: OrderedDict[_Key, Any] = OrderedDict()
        self.made = 0
        """Views made so far (the others a sweep asked for were reused)."""

    def view(self, content: Any, root: Any, types: Sequence[Any]) -> tuple[Any, bool]:
        """A recursive ContainerView of ``root`` over ``types`` (pyVmomi managed object classes), and
        whether it was made just now; the least recently used view is destroyed past ``limit``."""
        key = (root._moId, tuple(sorted(t._wsdlName for t in types)))
        found = self._views.get(key)
        if found is not None:
            self._views.move_to_end(key)
            return found, False
        view = content.viewManager.CreateContainerView(root, list(types), True)
        self.made += 1
        self._views[key] = view
        while len(self._views) > self.limit:
            _key, oldest = self._views.popitem(last=False)
            with suppress(Exception):  # best effort: the logout of the session ends it anyway
                oldest.DestroyView()
        return view, True

    def forget(self, view: Any) -> None:
        """Stop using ``view`` (the server no longer knows it)."""
        for key, kept in list(self._views.items()):
            if kept._moId == view._moId:
                del self._views[key]

    def clear(self) -> None:
        """Forget every view (the session logged in again: its views were the old login's)."""
        self._views.clear()

    def __len__(self) -> int:
        return len(self._views)
