"""The instance lock that tells a live claim from a dead one (``gateway.store.instance``)."""

from __future__ import annotations

import threading
from pathlib import Path

from gateway.store.instance import Instance


def take_at_once(instance: Instance, threads: int) -> tuple[list[str], list[BaseException]]:
    """``instance.acquire()`` from ``threads`` threads released together; the ids and the errors."""
    start = threading.Barrier(threads)
    ids: list[str] = []
    errors: list[BaseException] = []

    def take() -> None:
        start.wait()
        try:
            ids.append(instance.acquire())
        except BaseException as exc:  # the caller's assertion reports it
            errors.append(exc)

    workers = [threading.Thread(target=take) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return ids, errors


def test_first_use_from_many_threads_at_once_takes_the_lock_once(tmp_path: Path) -> None:
    # Two confirms arriving together both call acquire() from worker threads; a second flock on a
    # second descriptor of the same file conflicts even inside one process, so an unguarded first use
    # raised BlockingIOError in one of them (seen in CI as a failed confirm).
    for round_ in range(40):
        home = tmp_path / str(round_)
        instance = Instance(home)
        ids, errors = take_at_once(instance, 8)
        assert errors == [], f"round {round_}: {errors!r}"
        assert ids == [instance.id] * 8
        assert Instance(home).alive(instance.id)
        instance.close()
        assert not Instance(home).alive(instance.id)


def test_a_closed_instance_is_dead_and_its_lock_file_is_gone(tmp_path: Path) -> None:
    instance = Instance(tmp_path)
    other = Instance(tmp_path)
    instance.acquire()
    assert other.alive(instance.id)
    instance.close()
    assert not other.alive(instance.id)
    assert list((tmp_path / "instances").iterdir()) == []
