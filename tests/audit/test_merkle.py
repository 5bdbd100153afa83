"""RFC 6962 tree math (gateway.audit.merkle): the reference vectors of the RFC 6962 / Certificate
Transparency test data, and every inclusion and consistency proof of small trees checked against a
naive recursive definition of the tree."""

from __future__ import annotations

import pytest

from gateway.audit import merkle

#: the leaves of the certificate-transparency reference tree (hex of each leaf's data)
LEAVES = [bytes.fromhex(x) for x in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f")]
ROOTS = {
    1: "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    2: "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    3: "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    4: "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    5: "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    6: "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    7: "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    8: "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
}
INCLUSION = [  # (leaf index, tree size, audit path)
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (1, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]
CONSISTENCY = [  # (old size, new size, proof)
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]


def _stored(leaves: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """(stored hash sequence, root after each size) built by appending ``leaves`` (leaf hashes)."""
    frontier, stored, roots = merkle.Frontier(), [], [merkle.EMPTY_ROOT]
    for leaf in leaves:
        stored += frontier.append(leaf)
        roots.append(frontier.root())
    return stored, roots


def _naive_root(leaves: list[bytes]) -> bytes:
    if not leaves:
        return merkle.EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(_naive_root(leaves[:k]), _naive_root(leaves[k:]))


REFERENCE, REFERENCE_ROOTS = _stored([merkle.leaf_hash(d) for d in LEAVES])


def _read(stored: list[bytes]) -> merkle.HashReader:
    return lambda indexes: [stored[i] for i in indexes]


@pytest.mark.parametrize("size", sorted(ROOTS))
def test_the_roots_of_the_reference_tree(size: int) -> None:
    assert REFERENCE_ROOTS[size].hex() == ROOTS[size]
    assert merkle.tree_root(size, _read(REFERENCE)).hex() == ROOTS[size]
    assert merkle.root_of(merkle.leaf_hash(d) for d in LEAVES[:size]).hex() == ROOTS[size]


def test_the_empty_tree_is_the_hash_of_nothing() -> None:
    assert merkle.EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize(("index", "size", "path"), INCLUSION)
def test_inclusion_proofs_of_the_reference_tree(index: int, size: int, path: list[str]) -> None:
    proof = merkle.read_plan(merkle.inclusion_plan(index, size), _read(REFERENCE))
    assert [h.hex() for h in proof] == path
    leaf = merkle.leaf_hash(LEAVES[index])
    assert merkle.verify_inclusion(index, size, leaf, proof, REFERENCE_ROOTS[size])
    assert not merkle.verify_inclusion(index, size, merkle.leaf_hash(b"other"), proof, REFERENCE_ROOTS[size])
    assert not merkle.verify_inclusion(index, size, leaf, proof[:-1], REFERENCE_ROOTS[size])


@pytest.mark.parametrize(("old", "new", "path"), CONSISTENCY)
def test_consistency_proofs_of_the_reference_tree(old: int, new: int, path: list[str]) -> None:
    proof = merkle.read_plan(merkle.consistency_plan(old, new), _read(REFERENCE))
    assert [h.hex() for h in proof] == path
    assert merkle.verify_consistency(old, new, REFERENCE_ROOTS[old], REFERENCE_ROOTS[new], proof)


def test_every_proof_of_every_tree_up_to_40_leaves_verifies_and_a_wrong_root_does_not() -> None:
    leaves = [merkle.leaf_hash(str(i).encode()) for i in range(40)]
    stored, roots = _stored(leaves)
    read = _read(stored)
    for size in range(1, 41):
        assert roots[size] == _naive_root(leaves[:size]) == merkle.tree_root(size, read)
        assert len(stored[:merkle.stored_hash_count(size)]) == merkle.stored_hash_count(size)
        assert merkle.tree_size_for(merkle.stored_hash_count(size)) == size
        for index in range(size):
            proof = merkle.read_plan(merkle.inclusion_plan(index, size), read)
            assert merkle.verify_inclusion(index, size, leaves[index], proof, roots[size])
            assert not merkle.verify_inclusion(index, size, leaves[index], proof, roots[size - 1])
        for old in range(size + 1):
            proof = merkle.read_plan(merkle.consistency_plan(old, size), read)
            assert merkle.verify_consistency(old, size, roots[old], roots[size], proof)
            if 0 < old < size:
                assert not merkle.verify_consistency(old, size, roots[old - 1], roots[size], proof)
                assert not merkle.verify_consistency(old, size, roots[old], roots[size - 1], proof)


def test_a_cut_stored_sequence_has_no_tree_size() -> None:
    assert merkle.tree_size_for(merkle.stored_hash_count(8) - 1) is None
    assert merkle.tree_size_for(merkle.stored_hash_count(8) - 2) is None
    assert merkle.tree_size_for(0) == 0


def test_a_proof_needs_only_logarithmically_many_stored_hashes() -> None:
    assert len(merkle.inclusion_plan(123_456, 1_000_000).wanted()) <= 20 * 20
    assert len(merkle.inclusion_plan(123_456, 1_000_000).ranges) == 20


@pytest.mark.parametrize(("index", "size"), [(-1, 3), (3, 3), (0, 0)])
def test_no_inclusion_plan_outside_the_tree(index: int, size: int) -> None:
    with pytest.raises(ValueError, match="not in a tree"):
        merkle.inclusion_plan(index, size)
