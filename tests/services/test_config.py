"""basalt.services.config: every service setting from flag > env > file > default."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from basalt.admin import cli
from basalt.admin.service_specs import SERVICES, service_specs
from basalt.common.settings import describe
from basalt.services import config, process
from basalt.services.config import ConfigError, ServiceSpec
from basalt.services.pull_service import main as pull_main
from basalt.store import FlushDiskType, MessageStoreConfig
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

#: Each service's main (the table of them the command line runs).
SERVICE_MAINS = {name: importlib.import_module(c.module) for name, c in SERVICES.items()}
SPECS: dict[str, ServiceSpec] = {name: main.SPEC for name, main in SERVICE_MAINS.items()}
MAINS = {name: main.add_arguments for name, main in SERVICE_MAINS.items()}
REQUIRED = {"name": "broker-a", "data_dir": "/tmp/store", "id": "ps-1"}


def parsed(service: str, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    MAINS[service](parser)
    process.add_common_arguments(parser, f"basalt-{service}")
    return parser.parse_args(argv)


def resolved(
    service: str, argv: list[str], environ: dict[str, str] | None = None
) -> config.Resolved:
    args = parsed(service, argv)
    return process.settings(args, environ or {})


def required_flags(service: str, but: str = "") -> list[str]:
    """The flags giving ``service``'s required settings, except ``but``."""
    names = {o.name for o in SPECS[service].options()} - {but}
    return [x for n, v in REQUIRED.items() if n in names for x in (f"--{n.replace('_', '-')}", v)]


def test_the_four_layers_each_give_one_setting_strongest_first(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# RocketMQ style\n"
        "delete_when=04;16\n"
        "fileReservedTime=48\n"
        "flushDiskType=SYNC_FLUSH\n"
        "max_index_num=1000\n"
    )
    environ = {
        "BASALT_FILE_RESERVED_TIME_HOURS": "24",
        "BASALT_FLUSH_DISK_TYPE": "ASYNC_FLUSH",
        "BASALT_CONFIG": str(conf),
    }
    s = resolved(
        "store-node",
        ["--name", "b", "--data-dir", str(tmp_path), "--flush-disk-type", "SYNC_FLUSH"],
        environ,
    )
    assert s.values["delete_when"] == config.Value("04;16", f"file:{conf}:2")
    assert s.values["file_reserved_time_hours"] == config.Value(
        24, "env:BASALT_FILE_RESERVED_TIME_HOURS"
    )
    assert s.values["flush_disk_type"] == config.Value(
        FlushDiskType.SYNC_FLUSH, "flag:--flush-disk-type"
    )
    assert s.values["max_hash_slot_num"] == config.Value(5_000_000, "default")
    store = s.build(MessageStoreConfig)
    assert (store.delete_when, store.file_reserved_time_hours, store.max_index_num) == (
        "04;16",
        24,
        1000,
    )


@pytest.mark.parametrize("service", sorted(SPECS))
def test_every_setting_is_reachable_by_flag_env_and_file(service: str, tmp_path: Path) -> None:
    spec = SPECS[service].with_sections(process.TELEMETRY)
    options = spec.options()
    for section in spec.sections:
        hidden = section.hidden
        assert {o.field for o in options if o.section is section} == {
            s.name for s in describe(section.cls) if s.name not in hidden
        }
    for option in options:
        text = REQUIRED.get(option.name) or config.show(option.default) or "127.0.0.1:2379"
        if option.setting.type is bool:
            text = "false"
        others = required_flags(service, but=option.name)
        flag = resolved(service, [*others, option.flag, text])
        assert flag.values[option.name].source == f"flag:{option.flag}", option.name
        env = resolved(service, others, {option.env: text})
        assert env.values[option.name].source == f"env:{option.env}", option.name
        conf = tmp_path / f"{option.name}.conf"
        conf.write_text(f"{config.camel(option.field)}={text}\n")
        file = resolved(service, [*others, "--config", str(conf)])
        assert file.values[option.name] == flag.values[option.name].__class__(
            flag[option.name], f"file:{conf}:1"
        )
        assert flag[option.name] == env[option.name] == file[option.name]


@pytest.mark.parametrize("service", sorted(SPECS))
def test_the_defaults_are_the_dataclasses_own(service: str) -> None:
    s = resolved(service, required_flags(service))
    s.check(TelemetryConfig={"service_name": "s"})
    for option in SPECS[service].options():
        if option.name in REQUIRED or option.field in option.section.defaults:
            continue
        declared = option.setting.default
        if s.values[option.name].source == "default":
            assert s[option.name] == declared, option.name
        else:  # derived from another setting (an address, STOREHOST from it)
            assert option.name in {d.name for d in SPECS[service].derived}
            assert s.values[option.name].source.startswith("default (from")
    # The store-node's pull caps: one default, the dataclass's.
    caps = s.values.get("max_transfer_count_on_message_in_memory")
    assert caps is None or caps.value == 1024


def test_rocketmq_broker_conf_keys_are_accepted_and_unused_ones_reported(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerClusterName = ProdCluster\n"
        "brokerName=broker-a\n"
        "brokerId=0\n"
        "! a comment\n"
        "\n"
        f"storePathRootDir={tmp_path / 'store'}\n"
        "deleteWhen=04\n"
        "fileReservedTime=48\n"
        "brokerRole=ASYNC_MASTER\n"
        "flushDiskType=ASYNC_FLUSH\n"
        "mapedFileSizeCommitLog=1073741824\n"
        "checkCRCOnRecover=false\n"
        "maxTransferCountOnMessageInMemory=64\n"
        "namesrvAddr=127.0.0.1:9876\n"
    )
    s = resolved("store-node", ["--config", str(conf)])
    assert s["cluster"] == "ProdCluster" and s["name"] == "broker-a"
    assert s["data_dir"] == tmp_path / "store"
    assert s["file_reserved_time_hours"] == 48 and s["check_crc_on_recover"] is False
    assert s["max_transfer_count_on_message_in_memory"] == 64
    assert s["broker_id"] == 0  # a replication setting now (docs/replication.md)
    assert s.ignored == (
        f"brokerRole (file:{conf}:9)",
        f"namesrvAddr (file:{conf}:14)",
    )
    assert "ignored: brokerRole" in config.format_table(s)


def test_an_unknown_file_key_is_refused_with_its_line(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b\n# ok\nfileReservedTme=48\n")
    with pytest.raises(ConfigError, match=rf"{conf}:3: unknown setting 'fileReservedTme'"):
        resolved("store-node", ["--config", str(conf), "--data-dir", "/tmp/x"])
    conf.write_text("just words\n")
    with pytest.raises(ConfigError, match=rf"{conf}:1: expected key=value"):
        resolved("store-node", ["--config", str(conf)])


def test_a_bad_value_names_the_setting_and_its_source(tmp_path: Path) -> None:
    argv = ["--name", "b", "--data-dir", str(tmp_path)]
    bad = {"BASALT_FILE_RESERVED_TIME_HOURS": "-1"}
    with pytest.raises(ConfigError) as refused:
        resolved("store-node", argv, bad).build(MessageStoreConfig)
    assert str(refused.value) == (
        "file_reserved_time_hours must be non-negative, got -1 "
        "(from env BASALT_FILE_RESERVED_TIME_HOURS)"
    )
    with pytest.raises(ConfigError, match=r"lease_ttl_s must be an integer, got 'ten' \(from flag"):
        resolved("store-node", [*argv, "--lease-ttl-s", "ten"])
    with pytest.raises(ConfigError, match="name is required: give --name, env BASALT_NAME"):
        resolved("store-node", ["--data-dir", str(tmp_path)])


def test_print_config_exits_2_on_a_bad_value_and_0_without_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def serve(args: argparse.Namespace) -> None:
        raise AssertionError("--print-config must not start the service")

    argv = ["--id", "ps-1", "--etcd", "h1:2379,h2:2379", "--print-config"]
    monkeypatch.setenv("BASALT_HEARTBEAT_INTERVAL_MS", "0")
    assert process.main("basalt pull-service", "", pull_main.add_arguments, serve, argv) == 2  # type: ignore[arg-type]
    assert (
        "heartbeat_interval_ms must be positive, got 0 (from env BASALT_HEARTBEAT_INTERVAL_MS)"
        in (capsys.readouterr().err)
    )
    monkeypatch.delenv("BASALT_HEARTBEAT_INTERVAL_MS")
    assert process.main("basalt pull-service", "", pull_main.add_arguments, serve, argv) == 0  # type: ignore[arg-type]
    table = capsys.readouterr().out
    assert "etcd" in table and "h1:2379,h2:2379  flag:--etcd" in table
    assert "root_sampling_ratio" in table


def test_the_real_command_prints_the_config_and_refuses_a_bad_value(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "basalt.admin", "store-node", "--print-config"]
    ok = subprocess.run(
        [*command, "--name", "b", "--data-dir", str(tmp_path / "never-made")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "flag:--name" in ok.stdout and not (tmp_path / "never-made").exists()
    bad = subprocess.run(
        [*command, "--name", "b", "--data-dir", str(tmp_path), "--delete-when", "25"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "basalt-store-node: delete_when must be hours 00-23 separated by ';', "
        "got '25' (from flag --delete-when)"
    )


def test_a_public_name_may_be_declared_once() -> None:
    section = config.Section(MessageStoreConfig)
    with pytest.raises(TypeError, match="declared twice"):
        ServiceSpec("x", (section, dataclasses.replace(section))).options()


def test_the_docs_tables_of_every_setting_are_current() -> None:
    doc = Path(__file__).parents[2] / "docs" / "configuration.md"
    text = doc.read_text()
    specs = service_specs()
    assert list(specs) == list(SERVICES)
    for name in specs:
        assert f"<!-- settings: {name} -->" in text
    assert config.render_docs(text, specs) == text, (
        "run: python -m basalt.admin.service_specs docs/configuration.md"
    )


def print_config_rows(out: str) -> dict[str, tuple[str, str]]:
    """``--print-config``'s table: setting -> (value, source), read by the
    header's columns (a value may be empty)."""
    header, *lines = out.splitlines()
    value_at, source_at = header.index("value"), header.index("source")
    rows = {}
    for line in lines:
        assert not line.startswith("ignored:"), line
        name = line[:value_at].strip()
        rows[name] = (line[value_at:source_at].strip(), line[source_at:].strip())
    return rows


@pytest.mark.parametrize("service", list(SERVICES))
def test_print_config_with_no_other_flag_prints_every_setting_and_exits_0(
    service: str, tmp_path: Path
) -> None:
    # RocketMQ's `mqbroker -p`: no flag needed, the required ones shown unset.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BASALT_")}
    done = subprocess.run(
        [sys.executable, "-m", "basalt.admin", service, "--print-config"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    rows = print_config_rows(done.stdout)
    options = service_specs()[service].options()
    assert list(rows) == [o.name for o in options]
    for option in options:
        value, source = rows[option.name]
        if option.setting.required:
            assert (value, source) == ("(unset)", config.UNSET_SOURCE), option.name
        else:
            assert source.startswith("default"), (option.name, source)
            if source == "default":
                assert value == config.show(option.default), option.name
    assert any(o.setting.required for o in options) == (service != "admin-service")
    assert list(tmp_path.iterdir()) == []  # no store, no log, nothing started


def test_print_config_still_refuses_a_bad_value_beside_an_unset_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The unset --data-dir's section cannot be built: its other values are checked one by one.
    assert cli.main(["store-node", "--print-config", "--delete-when", "25"]) == 2
    assert capsys.readouterr().err.strip() == (
        "basalt-store-node: delete_when must be hours 00-23 separated by ';', "
        "got '25' (from flag --delete-when)"
    )
    assert cli.main(["store-node", "--print-config", "--name", ""]) == 2
    assert "broker_name must be a non-empty string, got ''" in capsys.readouterr().err
    # Run, not printed, an unset required setting is refused as before.
    assert cli.main(["store-node"]) == 2
    assert "name is required: give --name, env BASALT_NAME" in capsys.readouterr().err


def test_an_unset_setting_is_never_built() -> None:
    s = resolved("store-node", ["--print-config"])
    assert s.unset() == ["name", "data_dir"]
    assert s.values["name"] == config.Value(config.UNSET, config.UNSET_SOURCE)
    with pytest.raises(ConfigError, match="data_dir is required: give --data-dir"):
        s.build(MessageStoreConfig)
    s.check(TelemetryConfig={"service_name": "s"})  # what is set is valid


def test_addresses_derive_from_listen_and_an_empty_env_var_is_unset() -> None:
    s = resolved("store-node", [*required_flags("store-node"), "--listen", "0.0.0.0:10911"])
    assert s.values["advertise_address"] == config.Value("127.0.0.1:10911", "default (from listen)")
    assert s["client_address"] == s["store_host"] == "127.0.0.1:10911"
    given = resolved(
        "store-node",
        [*required_flags("store-node"), "--advertise-address", "10.0.0.5:10911"],
        {"BASALT_CLIENT_ADDRESS": "broker-a.example.com:30911", "BASALT_LEASE_TTL_S": ""},
    )
    assert (given["store_host"], given["client_address"]) == (
        "10.0.0.5:10911",
        "broker-a.example.com:30911",
    )
    assert given.values["lease_ttl_s"].source == "default"
    # Port 0 is only known once bound: the advertise address is taken from the bind then.
    anywhere = resolved("store-node", [*required_flags("store-node"), "--listen", "127.0.0.1:0"])
    anywhere.check(TelemetryConfig={"service_name": "s"})
    assert (anywhere["advertise_address"], anywhere["store_host"]) == ("", "127.0.0.1:0")
