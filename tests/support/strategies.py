"""Hypothesis strategies for the record layout's inputs: messages with every field
at its range's edges, hosts, properties of any encoded size."""

from __future__ import annotations

import ipaddress

from hypothesis import strategies as st

from basalt.common.message import Message, encode_properties
from basalt.common.record import MAX_PROPERTIES_SIZE

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def host_string(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """The canonical ``ip:port`` form decode_host returns (IPv6 bracketed)."""
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


hosts = st.builds(
    host_string,
    st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    st.integers(0, 65535),
)


def utf8_at_most(limit: int) -> st.SearchStrategy[str]:
    return st.text(max_size=limit).filter(lambda s: len(s.encode("utf-8")) <= limit)


def properties_of_size(size: int, filler: str) -> dict[str, str]:
    """One property ``P\\x01value\\x02`` whose encoding is exactly ``size`` bytes (size >= 3)."""
    head = (filler * size)[: max(0, (size - 3) // len(filler.encode("utf-8")))]
    value = head + "v" * (size - 3 - len(head.encode("utf-8")))
    props = {"P": value}
    assert len(encode_properties(props)) == size
    return props


property_text = st.text(
    st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), max_size=30
)
small_properties = st.dictionaries(property_text.filter(bool), property_text, max_size=6)
sized_properties = st.builds(
    properties_of_size,
    st.integers(3, MAX_PROPERTIES_SIZE),
    st.sampled_from(["x", "é", "中", "😀"]),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    return Message(
        topic=draw(utf8_at_most(127)),
        body=draw(st.binary(max_size=2048)),
        queue_id=draw(INT32),
        properties=draw(st.one_of(small_properties, sized_properties)),
        flag=draw(INT32),
        sys_flag=draw(st.integers(0, 0x7FFFFFFF)),
        born_timestamp_ms=draw(INT64),
        born_host=draw(hosts),
        reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64),
    )
