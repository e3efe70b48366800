"""``Finished``: the flag a download sets on the loop's thread and other threads wait for."""

from __future__ import annotations

import threading

from asyncgraph._runtime._finished import Download, Finished


def test_a_flag_never_set_times_out_and_says_so() -> None:
    finished = Finished()
    assert not finished.is_set()
    assert finished.wait(0.01) is False
    finished.set()
    assert finished.is_set()
    assert finished.wait(0.0) is True
    assert finished.wait() is True


def test_threads_waiting_before_and_after_the_set_all_wake() -> None:
    for early in (True, False):
        finished = Finished()
        woke: list[bool] = []
        started = threading.Barrier(4)

        def wait(
            flag: Finished = finished, seen: list[bool] = woke, go: threading.Barrier = started
        ) -> None:
            go.wait()
            seen.append(flag.wait(10))

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for thread in threads:
            thread.start()
        if early:
            finished.set()  # (possibly) before any thread made the event
            started.wait()
        else:
            started.wait()
            finished.set()
        for thread in threads:
            thread.join(15)
        assert woke == [True, True, True]


def test_a_download_is_finished_once_set() -> None:
    download = Download()
    assert not download.finished.is_set()
    download.finished.set()
    assert download.finished.wait(0)
