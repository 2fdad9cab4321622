import sys

import pytest

from grpo_aug.host_memory import keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_malloc_is_tuned_unless_the_user_chose_an_allocator(monkeypatch):
    for name in [n for n in __import__("os").environ if n.startswith("MALLOC_") or n == "LD_PRELOAD"]:
        monkeypatch.delenv(name)
    assert keep_freed_memory() is True  # glibc accepts both settings
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert keep_freed_memory() is False
