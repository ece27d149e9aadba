"""What /proc says about a process's memory, for tests that check what is shared between processes."""

from __future__ import annotations

from pathlib import Path


def anonymous_memory(pid: int) -> tuple[int, int]:
    """(shared, private) bytes of the process's resident anonymous memory (heap, anonymous mappings): pages a forked
    child still shares with its parent count as shared, pages it wrote since (copy-on-write) as private."""
    shared = private = 0
    anonymous = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
            anonymous = len(head) < 6 or head[5] == "[heap]" or head[5].startswith("[anon")
        elif anonymous and head[0] in ("Shared_Clean:", "Shared_Dirty:"):
            shared += int(head[1]) * 1024
        elif anonymous and head[0] in ("Private_Clean:", "Private_Dirty:"):
            private += int(head[1]) * 1024
    return shared, private
