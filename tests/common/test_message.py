"""common.message: properties, hosts, message ids, sysflag helpers."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basalt.common.message import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    MULTI_TAGS_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    MessageRecord,
    decode_host,
    decode_properties,
    encode_host,
    encode_properties,
    is_dispatchable,
    new_uniq_key,
    new_uniq_keys,
    offset_msg_id,
    parse_offset_msg_id,
    property_value,
    transaction_type,
)

# RocketMQ's string2messageProperties drops pairs with an empty name or value, so
# only non-empty names and values are guaranteed to survive a round trip.
property_text = st.text(
    st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]), min_size=1
)
property_dicts = st.dictionaries(property_text, property_text, max_size=10)


# -- properties --------------------------------------------------------------------------


def test_properties_encode_as_name_soh_value_stx_pairs() -> None:
    assert encode_properties({"TAGS": "TagA", "KEYS": "k1 k2"}) == (
        b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    )
    assert encode_properties({}) == b""
    assert encode_properties({"é": "中"}) == "é\x01中\x02".encode()


@settings(max_examples=200, deadline=None)
@given(props=property_dicts)
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


def test_decode_properties_skips_pairs_without_a_separator() -> None:
    assert decode_properties(b"") == {}
    assert decode_properties(b"A\x011\x02garbage\x02B\x012\x02") == {"A": "1", "B": "2"}
    # The trailing separator is optional for the last pair.
    assert decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}


@settings(max_examples=200, deadline=None)
@given(props=property_dicts, other=property_text)
def test_property_value_finds_each_property_without_decoding(
    props: dict[str, str], other: str
) -> None:
    data = encode_properties(props)
    for name, value in props.items():
        assert property_value(data, name.encode()) == value.encode()
    if other not in props:
        assert property_value(data, other.encode()) is None


def test_property_value_does_not_match_a_name_suffix() -> None:
    data = encode_properties({"XTAGS": "wrong", "TAGS": "right"})
    assert property_value(data, b"TAGS") == b"right"
    assert property_value(encode_properties({"XTAGS": "wrong"}), b"TAGS") is None
    assert property_value(encode_properties({"A": "TAGS", "MYTAGS": "x"}), b"TAGS") is None


def test_property_value_of_the_first_and_an_unterminated_last_pair() -> None:
    assert property_value(b"TAGS\x01a\x02KEYS\x01b", b"TAGS") == b"a"
    assert property_value(b"TAGS\x01a\x02KEYS\x01b", b"KEYS") == b"b"
    assert property_value(b"", b"TAGS") is None


# -- hosts -------------------------------------------------------------------------------


def test_encode_host_ipv4_is_four_ip_bytes_and_a_big_endian_port() -> None:
    assert encode_host("192.168.0.1:10911") == bytes([192, 168, 0, 1]) + struct.pack(">i", 10911)
    assert decode_host(bytes([192, 168, 0, 1, 0, 0, 0x2A, 0x9F])) == "192.168.0.1:10911"


def test_encode_host_ipv6_is_sixteen_ip_bytes_and_a_port_with_or_without_brackets() -> None:
    expected = ipaddress.IPv6Address("fe80::1").packed + struct.pack(">i", 8080)
    assert encode_host("[fe80::1]:8080") == expected
    assert encode_host("fe80::1:8080") == expected
    assert decode_host(expected) == "[fe80::1]:8080"


@settings(max_examples=150, deadline=None)
@given(
    ip=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    port=st.integers(0, 65535),
)
def test_hosts_round_trip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> None:
    text = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    raw = encode_host(text)
    assert len(raw) == (8 if ip.version == 4 else 20)
    assert raw[:-4] == ip.packed
    assert decode_host(raw) == text


# -- message ids -------------------------------------------------------------------------


def test_offset_msg_id_is_hex_of_store_ip_port_and_physical_offset() -> None:
    msg_id = offset_msg_id(encode_host("10.1.2.3:10911"), 0x0102030405060708)
    assert msg_id == "0A010203" + "00002A9F" + "0102030405060708"
    assert re.fullmatch(r"[0-9A-F]{32}", msg_id)


def test_offset_msg_id_ipv6_is_56_hex_digits() -> None:
    msg_id = offset_msg_id(encode_host("[::1]:9876"), 5)
    assert len(msg_id) == 56
    assert parse_offset_msg_id(msg_id) == ("[::1]:9876", 5)


@settings(max_examples=150, deadline=None)
@given(
    ip=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    port=st.integers(0, 65535),
    offset=st.integers(0, 2**63 - 1),
)
def test_offset_msg_id_round_trips(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, offset: int
) -> None:
    host = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    msg_id = offset_msg_id(encode_host(host), offset)
    assert msg_id == msg_id.upper()
    assert parse_offset_msg_id(msg_id) == (host, offset)
    assert parse_offset_msg_id(msg_id.lower()) == (host, offset)


@pytest.mark.parametrize("bad", ["", "0A0102", "0A010203" * 3])
def test_parse_offset_msg_id_rejects_wrong_lengths(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_offset_msg_id(bad)


def test_message_record_msg_id_uses_store_host_and_commit_log_offset() -> None:
    record = MessageRecord(
        store_size=0,
        body_crc=0,
        queue_id=0,
        flag=0,
        queue_offset=0,
        commit_log_offset=4096,
        sys_flag=0,
        born_timestamp_ms=0,
        born_host="1.2.3.4:5",
        store_timestamp_ms=0,
        store_host="127.0.0.1:10911",
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"",
        topic="T",
        properties={"TAGS": "a", "KEYS": "k1 k2  k3", "UNIQ_KEY": "U"},
    )
    assert record.msg_id == "7F000001" + "00002A9F" + f"{4096:016X}"
    assert (record.tags, record.keys, record.uniq_key) == ("a", ["k1", "k2", "k3"], "U")


def test_new_uniq_key_is_32_upper_case_hex_digits() -> None:
    for _ in range(100):
        assert re.fullmatch(r"[0-9A-F]{32}", new_uniq_key())


def _routes_ipv4() -> bool:
    """Whether this host has an IPv4 route off the machine (a UDP connect only
    looks it up)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("198.51.100.1", 9))  # TEST-NET-2
            return not ipaddress.IPv4Address(probe.getsockname()[0]).is_loopback
    except OSError:
        return False


def test_new_uniq_key_carries_this_hosts_ip_and_pid() -> None:
    """RocketMQ's MessageClientIDSetter: ip(4) pid(2) random(4) then time and
    counter. The ip is an IPv4 address of this host (a socket binds to it), not
    zeros nor loopback; every id of the process shares the first 10 bytes."""
    raw = [bytes.fromhex(k) for k in (new_uniq_key(), *new_uniq_keys(3), new_uniq_key())]
    assert len({r[:10] for r in raw}) == 1
    assert int.from_bytes(raw[0][4:6], "big") == os.getpid() & 0xFFFF
    ip = ipaddress.IPv4Address(raw[0][:4])
    if _routes_ipv4():
        assert not (ip.is_loopback or ip.is_unspecified), ip
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as bound:
            bound.bind((str(ip), 0))  # only an address of this host binds
    else:  # no IPv4 network: RocketMQ's fake IP (time bits, any value), never zeros
        assert not ip.is_unspecified, ip


def test_new_uniq_key_is_unique_across_many_calls() -> None:
    keys = [new_uniq_key() for _ in range(20_000)]
    assert len(set(keys)) == len(keys)


# -- Message -----------------------------------------------------------------------------


def test_all_properties_adds_tags_and_space_separated_keys() -> None:
    message = Message(topic="T", tags="TagA", keys=["k1", "k2", "k3"], properties={"a": "1"})
    assert message.all_properties() == {"a": "1", "TAGS": "TagA", "KEYS": "k1 k2 k3"}


def test_all_properties_tags_and_keys_override_user_properties() -> None:
    message = Message(topic="T", tags="real", keys=["k"], properties={"TAGS": "x", "KEYS": "y"})
    assert message.all_properties() == {"TAGS": "real", "KEYS": "k"}
    # The message's own dict is not modified.
    assert message.properties == {"TAGS": "x", "KEYS": "y"}


def test_all_properties_without_tags_or_keys_is_the_user_properties() -> None:
    assert Message(topic="T").all_properties() == {}
    assert Message(topic="T", tags="", keys=()).all_properties() == {}
    assert Message(topic="T", properties={"p": "v"}).all_properties() == {"p": "v"}


# -- sysflag -----------------------------------------------------------------------------


def test_sysflag_bits_are_rocketmqs() -> None:
    assert (COMPRESSED_FLAG, MULTI_TAGS_FLAG) == (0x1, 0x2)
    assert (TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE) == (0x0, 0x4)
    assert (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE) == (0x8, 0xC)
    assert (BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG) == (0x10, 0x20)


@pytest.mark.parametrize(
    ("tx_type", "dispatchable"),
    [
        (TRANSACTION_NOT_TYPE, True),
        (TRANSACTION_PREPARED_TYPE, False),
        (TRANSACTION_COMMIT_TYPE, True),
        (TRANSACTION_ROLLBACK_TYPE, False),
    ],
)
def test_is_dispatchable_by_transaction_type(tx_type: int, dispatchable: bool) -> None:
    other_bits = (
        0,
        COMPRESSED_FLAG,
        MULTI_TAGS_FLAG,
        BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG,
        0x7FFFFF00,
    )
    for other in other_bits:
        sys_flag = tx_type | other
        assert transaction_type(sys_flag) == tx_type
        assert is_dispatchable(sys_flag) is dispatchable
