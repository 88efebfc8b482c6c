"""Java's ``String.hashCode``, which RocketMQ's on-disk formats depend on.

ConsumeQueue tagsCode and IndexFile keyHash are both ``String.hashCode`` of a
Java string: ``s[0]*31^(n-1) + … + s[n-1]`` over UTF-16 code units, wrapped to
a signed 32-bit int. Tags repeat endlessly, so results are cached.
"""

from __future__ import annotations

from functools import lru_cache

_MASK32 = 0xFFFFFFFF


@lru_cache(maxsize=65536)
def java_string_hash(s: str) -> int:
    """Return Java's ``s.hashCode()`` as a signed 32-bit int."""
    h = 0
    if s.isascii():
        for b in s.encode("ascii"):
            h = (31 * h + b) & _MASK32
    else:
        units = s.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tagsCode of a TAGS property value: 0 when there is no tag."""
    if not tags:
        return 0
    return java_string_hash(tags)
