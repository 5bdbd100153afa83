"""RFC 6962 Merkle tree math over the audit rows: pure functions, no I/O.

Leaf i is the row with ``seq`` i + 1, exactly as stored. Storage is Go's ``sumdb/tlog`` layout: every
complete subtree's hash once, append-only, so an append reads nothing, a proof reads only the
O(log^2 n) hashes it names, and dropping old rows leaves the retained range provable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

HASH_SIZE = 32
#: the root of the empty tree: SHA-256 of nothing
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# -- where each complete subtree's hash is stored --------------------------------------------------------

def stored_hash_index(level: int, n: int) -> int:
    """Position of the hash of level ``level``'s ``n``-th subtree (leaves are level 0) in the stored
    sequence: level L's n-th hash is stored right after level L-1's (2n+1)-th."""
    for _ in range(level):
        n = 2 * n + 1
    index = 0
    while n > 0:
        index += n
        n >>= 1
    return index + level


def stored_hash_count(n: int) -> int:
    """How many hashes a tree of ``n`` leaves stores."""
    if n == 0:
        return 0
    count = stored_hash_index(0, n - 1) + 1
    last = n - 1
    while last & 1:
        count += 1
        last >>= 1
    return count


def tree_size_for(count: int) -> int | None:
    """The tree size whose stored sequence holds exactly ``count`` hashes, or None when none does (a
    sequence cut in the middle of an append)."""
    low, high = 0, count
    while low < high:  # stored_hash_count grows with n, and stored_hash_count(n) >= n
        middle = (low + high) // 2
        if stored_hash_count(middle) < count:
            low = middle + 1
        else:
            high = middle
    return low if stored_hash_count(low) == count else None


def frontier_indexes(n: int) -> list[int]:
    """Stored positions of the complete subtrees covering leaves [0, n), largest (leftmost) first."""
    return [stored_hash_index(level, (n >> level) - 1)
            for level in range(n.bit_length() - 1, -1, -1) if n >> level & 1]


@dataclass
class Frontier:
    """The complete subtrees covering a tree's leaves, largest first: enough to append and to give the
    root without reading anything."""

    size: int = 0
    hashes: list[bytes] = field(default_factory=list)

    def append(self, leaf: bytes) -> list[bytes]:
        """Add one leaf hash; return the hashes to append to the stored sequence (the leaf's, then
        those of the subtrees it completed)."""
        stored = [leaf]
        current, n = leaf, self.size
        while n & 1:
            current = node_hash(self.hashes.pop(), current)
            stored.append(current)
            n >>= 1
        self.hashes.append(current)
        self.size += 1
        return stored

    def root(self) -> bytes:
        return fold(self.hashes)

    def copy(self) -> Frontier:
        return Frontier(self.size, list(self.hashes))


def fold(hashes: Sequence[bytes]) -> bytes:
    """The root over complete subtrees given largest first (a range's aligned decomposition)."""
    if not hashes:
        return EMPTY_ROOT
    current = hashes[-1]
    for left in reversed(hashes[:-1]):
        current = node_hash(left, current)
    return current


def root_of(leaves: Iterable[bytes]) -> bytes:
    """The root over leaf hashes, streamed (memory O(log n))."""
    frontier = Frontier()
    for leaf in leaves:
        frontier.append(leaf)
    return frontier.root()


# -- proofs: which subtree hashes, then their values -----------------------------------------------------

def _range_indexes(lo: int, hi: int) -> list[int]:
    """Stored positions of the aligned complete subtrees making up leaves [lo, hi), largest first
    (``lo`` is aligned to every power of two up to the range's size, as in every RFC 6962 split)."""
    indexes: list[int] = []
    while lo < hi:
        size = hi - lo
        level = size.bit_length() - 1
        while lo % (1 << level):
            level -= 1
        indexes.append(stored_hash_index(level, lo >> level))
        lo += 1 << level
    return indexes


Range = tuple[int, int]


def _inclusion_ranges(index: int, lo: int, hi: int) -> list[Range]:
    if hi - lo <= 1:
        return []
    k = _split(hi - lo)
    if index < lo + k:
        return [*_inclusion_ranges(index, lo, lo + k), (lo + k, hi)]
    return [*_inclusion_ranges(index, lo + k, hi), (lo, lo + k)]


def _consistency_ranges(m: int, lo: int, hi: int, whole: bool) -> list[Range]:
    if m == hi - lo:
        return [] if whole else [(lo, hi)]
    k = _split(hi - lo)
    if m <= k:
        return [*_consistency_ranges(m, lo, lo + k, whole), (lo + k, hi)]
    return [*_consistency_ranges(m - k, lo + k, hi, False), (lo, lo + k)]


@dataclass(frozen=True)
class Plan:
    """A proof to read: the subtree ranges it is made of, in proof order, and the stored positions
    each range's hash folds from."""

    ranges: tuple[Range, ...]
    indexes: tuple[tuple[int, ...], ...]

    def wanted(self) -> list[int]:
        """Every stored position to read, sorted, once each."""
        return sorted({i for group in self.indexes for i in group})


def _plan(ranges: list[Range]) -> Plan:
    return Plan(tuple(ranges), tuple(tuple(_range_indexes(lo, hi)) for lo, hi in ranges))


def inclusion_plan(index: int, size: int) -> Plan:
    """The audit path of leaf ``index`` in the tree of ``size`` leaves (RFC 6962 2.1.1), leaf to root."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size} leaves")
    return _plan(_inclusion_ranges(index, 0, size))


def consistency_plan(old: int, new: int) -> Plan:
    """The consistency proof from the tree of ``old`` leaves to that of ``new`` (RFC 6962 2.1.2)."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from {old} to {new} leaves: need 0 <= old <= new")
    if old == 0:
        return _plan([])
    return _plan(_consistency_ranges(old, 0, new, True))


def root_plan(size: int) -> Plan:
    """The one "proof" element that is the root of the tree of ``size`` leaves."""
    return _plan([(0, size)] if size else [])


def fold_plan(plan: Plan, stored: Mapping[int, bytes]) -> list[bytes]:
    """The proof's hashes from the stored hashes ``plan.wanted()`` read."""
    return [fold([stored[i] for i in group]) for group in plan.indexes]


HashReader = Callable[[Sequence[int]], Sequence[bytes]]


def read_plan(plan: Plan, read: HashReader) -> list[bytes]:
    """``fold_plan`` over hashes fetched by ``read`` (stored positions -> hashes, in that order)."""
    wanted = plan.wanted()
    return fold_plan(plan, dict(zip(wanted, read(wanted), strict=True)))


def tree_root(size: int, read: HashReader) -> bytes:
    return fold(list(read(frontier_indexes(size))))


# -- verification (RFC 9162) -----------------------------------------------------------------------------

def root_from_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes | None:
    """The root ``path`` proves for ``leaf`` at ``index`` of ``size`` leaves; None when the path does not
    fit that position (wrong length)."""
    if not 0 <= index < size:
        return None
    fn, sn, current = index, size - 1, leaf
    for sibling in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            current = node_hash(sibling, current)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            current = node_hash(current, sibling)
        fn >>= 1
        sn >>= 1
    return current if sn == 0 else None


def verify_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes], root: bytes) -> bool:
    return root_from_inclusion(index, size, leaf, path) == root


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes,
                       path: Sequence[bytes]) -> bool:
    """Whether ``path`` proves the tree of ``old`` leaves (``old_root``) is a prefix of the tree of
    ``new`` leaves (``new_root``)."""
    if not 0 <= old <= new:
        return False
    if old == new:
        return not path and old_root == new_root
    if old == 0:
        return not path and old_root == EMPTY_ROOT
    proof = list(path)
    if old & (old - 1) == 0:
        proof.insert(0, old_root)
    if not proof:
        return False
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    first = second = proof[0]
    for item in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            first = node_hash(item, first)
            second = node_hash(item, second)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            second = node_hash(second, item)
        fn >>= 1
        sn >>= 1
    return sn == 0 and first == old_root and second == new_root


class RootRecorder:
    """Streams leaves (after a ``start`` frontier: the hashes of rows no longer at hand) and keeps the
    root at each size in ``wanted``: what verification compares signed and witnessed heads with."""

    def __init__(self, wanted: Iterable[int], start: Frontier | None = None) -> None:
        self.frontier = start.copy() if start is not None else Frontier()
        self.wanted = set(wanted)
        self.roots: dict[int, bytes] = {}
        self._note()

    def add(self, leaf: bytes) -> None:
        self.frontier.append(leaf)
        self._note()

    def _note(self) -> None:
        if self.frontier.size in self.wanted:
            self.roots[self.frontier.size] = self.frontier.root()
