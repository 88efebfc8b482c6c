"""store.hashing: Java's String.hashCode, checked against values and against a real JVM."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basalt.store.hashing import java_string_hash, tags_code
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

# Values printed by OpenJDK 17's String.hashCode.
KNOWN_JAVA_HASHES = [
    ("", 0),
    ("a", 97),
    ("abc", 96354),
    ("TagA", 2598919),
    ("hello", 99162322),
    ("Hello World", -862545276),
    ("été", 227742),
    ("中文标签", 622041809),
    ("😀", 1772899),  # U+1F600: surrogate pair D83D DE00
    ("tag-🚀-𐐷", 1831921805),  # two non-BMP characters
    ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
]


@pytest.mark.parametrize(("text", "expected"), KNOWN_JAVA_HASHES)
def test_java_string_hash_matches_known_java_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def _reference_hash(text: str) -> int:
    """The definition: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as an int32.

    Computed exactly (no wrapping until the end), unlike the implementation.
    """
    units = text.encode("utf-16-be")
    total = 0
    for i in range(0, len(units), 2):
        total = total * 31 + int.from_bytes(units[i : i + 2], "big")
    total &= 0xFFFFFFFF
    return total - (1 << 32) if total >= 1 << 31 else total


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_java_string_hash_follows_the_definition_and_fits_an_int32(text: str) -> None:
    h = java_string_hash(text)
    assert -(2**31) <= h < 2**31
    assert h == _reference_hash(text)


def test_tags_code_is_zero_without_a_tag_and_the_hash_otherwise() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919
    assert tags_code("中文标签") == 622041809


JAVA_HASH_PROGRAM = """
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;

public class Hash {
    public static void main(String[] args) throws Exception {
        StringBuilder out = new StringBuilder();
        for (String line : Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8)) {
            byte[] utf8 = HexFormat.of().parseHex(line);
            out.append(new String(utf8, StandardCharsets.UTF_8).hashCode()).append('\\n');
        }
        System.out.print(out);
    }
}
"""


def _random_strings(rng: random.Random, count: int) -> list[str]:
    """ASCII, BMP (incl. CJK and the top of the BMP) and non-BMP strings of mixed lengths."""
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        [chr(c) for c in range(0xA0, 0x800)],
        [chr(c) for c in range(0x4E00, 0x4F00)] + [chr(c) for c in range(0xE000, 0xE100)],
        [chr(c) for c in range(0xFF00, 0x10000)],
        [chr(c) for c in (0x1F600, 0x1F680, 0x10437, 0x1D11E, 0x10FFFF, 0x10000, 0x20000)],
    ]
    strings = ["", "TagA", "polygenelubricants", "\x00", "😀" * 40]
    while len(strings) < count:
        length = rng.choice([1, 2, 3, 7, 16, 50, 300])
        mixed = [pool for pool in pools if rng.random() < 0.6] or pools[:1]
        strings.append("".join(rng.choice(rng.choice(mixed)) for _ in range(length)))
    return strings


def test_java_string_hash_agrees_with_a_real_jvm(tmp_path: Path) -> None:
    java = shutil.which("java")
    assert java is not None, "this test needs a JDK >= 11 ('java' on PATH); CI installs Java 17"
    strings = _random_strings(random.Random(20240601), 200)
    assert any(len(s) != len(s.encode("utf-16-le")) // 2 for s in strings)  # surrogate pairs
    source = tmp_path / "Hash.java"
    source.write_text(JAVA_HASH_PROGRAM, encoding="utf-8")
    data = tmp_path / "strings.txt"
    data.write_text("".join(s.encode("utf-8").hex() + "\n" for s in strings), encoding="ascii")

    proc = subprocess.run(
        [java, str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=tmp_path,
        check=False,
    )

    assert proc.returncode == 0, proc.stderr
    java_hashes = [int(line) for line in proc.stdout.split()]
    assert len(java_hashes) == len(strings)
    mismatches = [
        (s, j, java_string_hash(s))
        for s, j in zip(strings, java_hashes, strict=True)
        if java_string_hash(s) != j
    ]
    assert mismatches == []
