"""The server's allocator settings (server/runtime.py `tune_allocator`): a large object's memory is reused,
not mapped afresh, so copying a 16 MiB result does not fault in 4,096 new pages while it holds the GIL."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from server import runtime

# In a process of its own (the settings are process-wide): a helper thread makes and drops a 16 MiB string,
# then the main thread does, six times; the minor page faults of each round after the first are printed.
_ROUNDS = """
import resource, sys, threading
from server.runtime import tune_allocator
print(tune_allocator() if sys.argv[1] == "tuned" else None)
SIZE = 16 << 20
def made_and_dropped() -> None:
    text = (b"x" * SIZE).decode()
    del text
def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds = []
for _ in range(6):
    before = faults()
    helper = threading.Thread(target=made_and_dropped)
    helper.start()
    helper.join()
    made_and_dropped()
    rounds.append(faults() - before)
print(max(rounds[1:]))
"""


def _faults_per_round(mode: str) -> tuple[str, int]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    run = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True, env=env)
    took, faults = run.stdout.split()
    return took, int(faults)


def _huge_pages_always() -> bool:
    """Whether the kernel backs large blocks with 2 MiB pages anyway (then 16 MiB faults in about 8)."""
    try:
        return "[always]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


@pytest.mark.skipif(not runtime._glibc(), reason="glibc's allocator settings")
@pytest.mark.skipif(_huge_pages_always(), reason="transparent huge pages always: few faults either way")
def test_a_large_objects_memory_is_reused_by_the_next_one_in_any_thread() -> None:
    took, tuned = _faults_per_round("tuned")
    assert took == "True"
    _, untuned = _faults_per_round("untuned")
    pages = (16 << 20) // 4096
    assert untuned >= pages // 2  # without the settings, each round maps (and faults in) fresh memory
    assert tuned < pages // 10


def test_the_operators_own_allocator_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert runtime.tune_allocator() is False


# Two 16 MiB strings made and kept, so the second cannot reuse the first's memory: the first grows the heap
# into fresh pages; the second is made after warm_heap. The page faults of each making are printed.
_WARMED = """
import resource
from server.runtime import tune_allocator, warm_heap
print(tune_allocator())
SIZE = 16 << 20
kept = []
def faults_making_one() -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    kept.append((b"x" * SIZE).decode())
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
cold = faults_making_one()
warm_heap(2 * SIZE)
print(cold, faults_making_one())
"""


@pytest.mark.skipif(not runtime._glibc(), reason="glibc's allocator settings")
@pytest.mark.skipif(_huge_pages_always(), reason="transparent huge pages always: few faults either way")
def test_a_warmed_heap_gives_a_large_object_pages_already_in_memory() -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    run = subprocess.run([sys.executable, "-c", _WARMED], capture_output=True, text=True, check=True, env=env)
    took, cold, warmed = run.stdout.split()
    assert took == "True"
    pages = (16 << 20) // 4096
    assert int(cold) >= pages  # the bytes and the string made of them: fresh pages
    assert int(warmed) < pages // 10

