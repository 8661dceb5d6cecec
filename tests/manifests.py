"""Offline checks of manifests/ and the Dockerfile, run by tests/manifests.sh in the test venv.

1. kustomization: every resource it lists exists, every manifest in manifests/ is listed,
   and `kubectl kustomize` builds it into exactly the objects of those files. The same
   for the monitoring component (manifests/monitoring/, opt-in, and the component in its
   api-and-leader/ folder), built into the install by tests/monitoring/overlay.
2. schemas: every document of every YAML file under manifests/ validates, strictly
   (unknown fields fail), against the Kubernetes schemas bundled by kubernetes-validate,
   or, for a custom resource, against its CRD's schema from manifests/, or, for the
   Prometheus Operator's kinds (manifests/monitoring/), against the schema of their
   models in cloudcoil-models-prometheus-operator. A document that none knows fails:
   nothing is skipped.
3. checkov: no failed check on manifests/ (kubernetes) nor on the Dockerfile; skips must
   be written beside the resource, with a reason, and are listed here.
4. hadolint: no finding on the Dockerfile (an ignore is written beside the line, with why).
5. flags: the Deployment runs a subcommand the binary has (RECONCILE_WATCHDOG_BIN), with
   only flags and RECONCILE_WATCHDOG_* variables that subcommand reads: clap ignores an
   unknown variable, so a typo there would silently leave a default in force.
6. high availability: the Deployment runs 2+ replicas with --leader-elect, rolls without
   taking a ready pod away first, gets POD_NAME and POD_NAMESPACE from the downward API
   and spreads its replicas (soft anti-affinity or topology spread); a namespaced Role,
   bound to its service account, grants get, create, update and patch on its Lease; a
   PodDisruptionBudget keeps one replica.
7. hang Events: the operator's service account may create and patch events.k8s.io
   Events, and nothing else on any events (no read, no delete, no core/v1 events, no
   wildcard), and the Deployment does not turn them off.
"""

import copy
import json
import os
import pathlib
import re
import subprocess
import sys

import jsonschema
import yaml
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator
from kubernetes_validate import utils as kv

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
KUSTOMIZATION = MANIFESTS / "kustomization.yaml"
MONITORING = MANIFESTS / "monitoring"
MONITORING_OVERLAY = ROOT / "tests" / "monitoring" / "overlay"
# The Prometheus Operator's kinds that manifests/monitoring/ uses. kubernetes-validate
# bundles only Kubernetes' own kinds, and the operator publishes its CRDs as YAML in its
# repository, not on PyPI; cloudcoil-models-prometheus-operator has pydantic models
# generated from them (0.80.1; its newer releases need Python 3.14), whose JSON Schema
# these are checked against.
PROMETHEUS_OPERATOR_KINDS = ("ServiceMonitor", "PrometheusRule")
DOCKERFILE = ROOT / "Dockerfile"
# The oldest Kubernetes the manifests support, and the newest kubernetes-validate bundles.
KUBERNETES_VERSIONS = sorted({"1.33.0", kv.latest_version()})


def relative(path):
    return path.relative_to(ROOT).as_posix()


def documents(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def manifest_files():
    return sorted(p for p in MANIFESTS.rglob("*") if p.suffix in (".yaml", ".yml"))


def check_kustomization():
    """Every listed resource exists, every top-level manifest is listed, and it builds."""
    failures = []
    (kustomization,) = documents(KUSTOMIZATION)
    listed = kustomization.get("resources") or []
    if not listed:
        failures.append(f"{relative(KUSTOMIZATION)}: lists no resources")
    for name in listed:
        if not (MANIFESTS / name).exists():
            failures.append(f"{relative(KUSTOMIZATION)}: resource {name} does not exist")
    for path in sorted(MANIFESTS.glob("*.y*ml")):
        if path != KUSTOMIZATION and path.name not in listed:
            failures.append(f"{relative(path)}: not listed in {relative(KUSTOMIZATION)}")
    if failures:
        return failures
    return (check_kustomize_build(listed)
            + check_components()
            + check_monitoring_build(listed))


def component_files(folder):
    """The files a kustomization in `folder` lists: resources and generator files."""
    (kustomization,) = documents(folder / "kustomization.yaml")
    files = list(kustomization.get("resources") or [])
    for generator in kustomization.get("configMapGenerator") or []:
        files += [f.split("=", 1)[-1] for f in generator.get("files") or []]
    return kustomization, files


def check_components():
    """Each component under manifests/ lists every manifest of its folder, and all exist."""
    failures = []
    for path in sorted(MANIFESTS.rglob("kustomization.yaml")):
        if path == KUSTOMIZATION:
            continue
        folder = path.parent
        kustomization, files = component_files(folder)
        if kustomization.get("kind") != "Component":
            failures.append(f"{relative(path)}: is a {kustomization.get('kind')}, not a Component")
        for name in files + list(kustomization.get("components") or []):
            if not (folder / name).exists():
                failures.append(f"{relative(path)}: {name} does not exist")
        for manifest in sorted(folder.glob("*.y*ml")):
            if manifest != path and manifest.name not in files:
                failures.append(f"{relative(manifest)}: not listed in {relative(path)}")
    return failures


def component_objects(folder):
    """The identities of what the component in `folder` adds, its own components' too."""
    (kustomization,) = documents(folder / "kustomization.yaml")
    objects = [identity(doc) for name in kustomization.get("resources") or []
               for doc in documents(folder / name)]
    objects += [("v1", "ConfigMap", g.get("namespace"), g["name"])
                for g in kustomization.get("configMapGenerator") or []]
    for name in kustomization.get("components") or []:
        objects += component_objects(folder / name)
    return objects


def check_monitoring_build(listed):
    """The install with the monitoring component builds into its objects and the base's."""
    kubectl = pathlib.Path(sys.executable).parent / "kubectl"
    run = subprocess.run([str(kubectl), "kustomize", relative(MONITORING_OVERLAY)],
                         cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return [f"kubectl kustomize {relative(MONITORING_OVERLAY)} failed: {run.stderr.strip()}"]
    built = [doc for doc in yaml.safe_load_all(run.stdout) if doc]
    expected = [identity(doc) for name in listed for doc in documents(MANIFESTS / name)]
    expected += component_objects(MONITORING)
    if sorted(map(identity, built)) != sorted(expected):
        return [f"kubectl kustomize {relative(MONITORING_OVERLAY)} built "
                f"{sorted(map(identity, built))}, but the files hold {sorted(expected)}"]
    print(f"ok   kubectl kustomize {relative(MONITORING_OVERLAY)}: {len(built)} objects")
    return check_generated(built) + check_service_monitor(built)


def check_generated(built):
    """The objects kustomize generates (the dashboard's ConfigMap) have no file to be
    validated from: validate them as built."""
    failures = []
    for doc in built:
        if doc["kind"] != "ConfigMap":
            continue
        where = f"{relative(MONITORING_OVERLAY)}: ConfigMap/{doc['metadata']['name']}"
        for version in KUBERNETES_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
                print(f"ok   {where} against Kubernetes {version}")
            except kv.ValidationError as error:
                failures.append(f"{where}: invalid for Kubernetes {version}: {error.message}")
    return failures


def check_service_monitor(built):
    """The ServiceMonitor selects the metrics Service by its labels and names its port."""
    failures = []
    services = [d for d in built if d["kind"] == "Service"]
    for monitor in (d for d in built if d["kind"] == "ServiceMonitor"):
        where = f"ServiceMonitor/{monitor['metadata']['name']}"
        selector = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services
                    if s["metadata"]["namespace"] == monitor["metadata"]["namespace"]
                    and selector.items() <= (s["metadata"].get("labels") or {}).items()]
        if not selected:
            failures.append(f"{where}: selects no Service of the install")
        ports = {p.get("name") for s in selected for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint.get("port") not in ports:
                failures.append(f"{where}: port {endpoint.get('port')!r} is not a port of "
                                f"the Services it selects ({sorted(ports)})")
        if not failures:
            print(f"ok   {where} selects Service/{selected[0]['metadata']['name']} port "
                  f"{', '.join(e['port'] for e in monitor['spec']['endpoints'])}")
    return failures


def identity(doc):
    metadata = doc.get("metadata") or {}
    return (doc.get("apiVersion"), doc.get("kind"), metadata.get("namespace"), metadata.get("name"))


def check_kustomize_build(listed):
    """kubectl kustomize builds it, into the objects of the listed files and no others."""
    kubectl = pathlib.Path(sys.executable).parent / "kubectl"
    run = subprocess.run([str(kubectl), "kustomize", relative(MANIFESTS)],
                         cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return [f"kubectl kustomize {relative(MANIFESTS)} failed: {run.stderr.strip()}"]
    built = sorted(identity(doc) for doc in yaml.safe_load_all(run.stdout) if doc)
    expected = sorted(identity(doc) for name in listed for doc in documents(MANIFESTS / name))
    if built != expected:
        return [f"kubectl kustomize built {built}, but the listed files hold {expected}"]
    print(f"ok   kubectl kustomize {relative(MANIFESTS)}: {len(built)} objects")
    return []


def openapi_to_jsonschema(schema):
    """A CRD's structural schema as the API server applies it, in JSON Schema terms.

    Unknown fields fail (the API server would prune them silently, which hides a typo),
    `nullable` admits null and `x-kubernetes-int-or-string` admits both.
    """
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if node.get("nullable") and "type" in node:
            node["type"] = [node["type"], "null"]
        if node.get("x-kubernetes-int-or-string"):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for key in ("properties", "patternProperties"):
            for child in node.get(key, {}).values():
                walk(child)
        for key in ("items", "additionalProperties", "not"):
            walk(node.get(key))
        for key in ("allOf", "anyOf", "oneOf"):
            for child in node.get(key, []):
                walk(child)

    walk(schema)
    return schema


def prometheus_operator_schemas():
    """(apiVersion, kind) -> JSON Schema of each of PROMETHEUS_OPERATOR_KINDS, strict
    (unknown fields fail, as the API server would prune them silently)."""

    def strict(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for child in node.values():
                strict(child)
        elif isinstance(node, list):
            for child in node:
                strict(child)
        return node

    return {
        ("monitoring.coreos.com/v1", kind):
            strict(getattr(prometheus_operator, kind).model_json_schema(by_alias=True))
        for kind in PROMETHEUS_OPERATOR_KINDS
    }


def custom_resource_schemas(docs):
    """(apiVersion, kind) -> JSON Schema, for every served version of every CRD given."""
    schemas = {}
    for _, doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = openapi_to_jsonschema(version["schema"]["openAPIV3Schema"])
    return schemas


def check_schemas():
    failures = []
    docs = [
        (path, doc)
        for path in manifest_files()
        for doc in documents(path)
        if path.name != "kustomization.yaml"
    ]
    if not docs:
        return [f"{relative(MANIFESTS)}: no manifests found"]
    crs = custom_resource_schemas(docs)
    operator_schemas = prometheus_operator_schemas()
    for path, doc in docs:
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            failures.append(f"{relative(path)}: not a Kubernetes object (no apiVersion or kind)")
            continue
        where = f"{relative(path)}: {doc['kind']}/{(doc.get('metadata') or {}).get('name')}"
        key = (doc["apiVersion"], doc["kind"])
        if key in operator_schemas:
            errors = sorted(jsonschema.Draft202012Validator(operator_schemas[key])
                            .iter_errors(doc), key=str)
            for error in errors:
                at = ".".join(str(p) for p in error.absolute_path) or "(root)"
                failures.append(f"{where}: does not match the Prometheus Operator's "
                                f"schema: {at}: {error.message}")
            if not errors:
                print(f"ok   {where} matches the Prometheus Operator's schema")
            continue
        if key in crs:
            # apiVersion, kind and metadata are the API server's; the CRD schema covers the rest.
            body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
            errors = sorted(jsonschema.Draft7Validator(crs[key]).iter_errors(body), key=str)
            if not (doc.get("metadata") or {}).get("name"):
                failures.append(f"{where}: metadata.name is missing")
            for error in errors:
                at = ".".join(str(p) for p in error.absolute_path) or "(root)"
                failures.append(f"{where}: does not match its CRD: {at}: {error.message}")
            if not errors:
                print(f"ok   {where} matches its CRD in manifests/")
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
                print(f"ok   {where} against Kubernetes {version}")
            except kv.ValidationError as error:
                at = ".".join(str(p) for p in error.path) or "(root)"
                failures.append(f"{where}: invalid for Kubernetes {version}: {at}: {error.message}")
            except kv.SchemaNotFoundError:
                failures.append(f"{where}: no Kubernetes {version} schema and no CRD in "
                                f"manifests/ for {doc['apiVersion']} {doc['kind']}")
                break
            except kv.InvalidSchemaError as error:
                failures.append(f"{where}: {error.message}")
    return failures


def checkov(args, framework):
    """One checkov run: its failures, and every skip with its reason printed."""
    command = [str(pathlib.Path(sys.executable).parent / "checkov"), *args,
               "--framework", framework, "--skip-download", "--output", "json"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    # 0: all passed; 1: some failed. Anything else is checkov itself failing.
    if run.returncode not in (0, 1):
        return [f"checkov {framework} exited {run.returncode}: {run.stderr.strip()}"]
    report = json.loads(run.stdout)
    reports = report if isinstance(report, list) else [report]
    reports = [r for r in reports if r.get("check_type") == framework]
    if not reports:
        return [f"checkov {framework} checked nothing: {run.stdout.strip()[:500]}"]
    failures = []
    for r in reports:
        summary, results = r["summary"], r["results"]
        print(f"checkov {framework}: {summary['passed']} passed, {summary['failed']} failed, "
              f"{summary['skipped']} skipped on {summary['resource_count']} resources")
        if summary["passed"] == 0:
            failures.append(f"checkov {framework}: no check passed, so nothing was checked")
        if summary["parsing_errors"]:
            failures.append(f"checkov {framework}: could not parse {results.get('parsing_errors')}")
        for c in results["skipped_checks"]:
            reason = (c.get("check_result") or {}).get("suppress_comment") or ""
            print(f"skip {c['check_id']} on {c['resource']}: {reason}")
            if not reason.strip() or reason.strip() == "No comment provided":
                failures.append(f"{c['file_path']}: {c['check_id']} skipped without a reason")
        for c in results["failed_checks"]:
            failures.append(f"{c['file_path']}: {c['check_id']} {c['check_name']} "
                            f"failed on {c['resource']} (lines {c['file_line_range']})")
    return failures


def check_checkov():
    return (checkov(["--directory", relative(MANIFESTS)], "kubernetes")
            + checkov(["--file", relative(DOCKERFILE)], "dockerfile"))


def check_hadolint():
    hadolint = pathlib.Path(sys.executable).parent / "hadolint"
    run = subprocess.run([str(hadolint), "--no-color", relative(DOCKERFILE)],
                         cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return [f"hadolint exited {run.returncode}: {(run.stdout + run.stderr).strip()}"]
    print(f"ok   hadolint {relative(DOCKERFILE)}")
    return []


def check_flags():
    binary = os.environ["RECONCILE_WATCHDOG_BIN"]
    failures = []
    (deployment,) = documents(MANIFESTS / "deployment.yaml")
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        args = container.get("args") or []
        if not args:
            failures.append(f"container {container['name']}: no subcommand in args")
            continue
        # A clean environment, so that the help shows no values set here.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_WATCHDOG_")}
        run = subprocess.run([binary, args[0], "--help"], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            failures.append(f"container {container['name']}: `{args[0]} --help` exited "
                            f"{run.returncode}: {run.stderr.strip()}")
            continue
        names = [e["name"] for e in container.get("env") or []]
        unknown = [n for n in names if n.startswith("RECONCILE_WATCHDOG_")
                   and f"[env: {n}=" not in run.stdout]
        # A flag in --help is followed by its value's name, or by a newline (a switch).
        unknown += [a for a in args[1:] if a.startswith("--")
                    and not re.search(rf"{re.escape(a.split('=')[0])}[ \n]", run.stdout)]
        for name in unknown:
            failures.append(f"container {container['name']}: `{args[0]}` does not read {name}")
        if not unknown:
            print(f"ok   container {container['name']}: `{' '.join(args)}` reads {', '.join(names)}")
    return failures


def all_documents():
    return [doc for path in manifest_files() if path != KUSTOMIZATION for doc in documents(path)]


def check_ha():
    failures = []
    docs = all_documents()
    (deployment,) = documents(MANIFESTS / "deployment.yaml")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    namespace = deployment["metadata"]["namespace"]
    labels = spec["template"]["metadata"]["labels"]
    if spec.get("replicas", 1) < 2:
        failures.append(f"deployment: replicas {spec.get('replicas', 1)}, want 2 or more")
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate":
        failures.append("deployment: Recreate takes every replica down at once")
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container.get("env") or []}
    if "--leader-elect" not in (container.get("args") or []) and \
            (env.get("RECONCILE_WATCHDOG_LEADER_ELECT") or {}).get("value") != "true":
        failures.append("deployment: --leader-elect is not on")
    for name, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        ref = ((env.get(name) or {}).get("valueFrom") or {}).get("fieldRef") or {}
        if ref.get("fieldPath") != field:
            failures.append(f"deployment: {name} is not set from the downward API ({field})")
    anti = ((pod.get("affinity") or {}).get("podAntiAffinity") or {}) \
        .get("preferredDuringSchedulingIgnoredDuringExecution")
    spread = [t for t in pod.get("topologySpreadConstraints") or []
              if t.get("whenUnsatisfiable") == "ScheduleAnyway"]
    if not anti and not spread:
        failures.append("deployment: no soft pod anti-affinity nor topology spread")

    account = pod.get("serviceAccountName")
    roles = {d["metadata"]["name"]: d for d in docs
             if d.get("kind") == "Role" and d["metadata"].get("namespace") == namespace}
    granted = set()
    for binding in docs:
        if binding.get("kind") != "RoleBinding" or binding["metadata"].get("namespace") != namespace:
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   for s in binding.get("subjects") or []):
            continue
        role = roles.get(binding["roleRef"]["name"]) if binding["roleRef"]["kind"] == "Role" else None
        for rule in (role or {}).get("rules") or []:
            if "coordination.k8s.io" in rule.get("apiGroups", []) and "leases" in rule.get("resources", []):
                granted.update(rule.get("verbs", []))
    missing = {"get", "create", "update", "patch"} - granted
    if missing:
        failures.append(f"rbac: the service account {account} may not {sorted(missing)} leases "
                        f"in {namespace} through a Role")

    budgets = [d for d in docs if d.get("kind") == "PodDisruptionBudget"
               and d["metadata"].get("namespace") == namespace]
    if not any(b["spec"].get("minAvailable") == 1
               and (b["spec"].get("selector") or {}).get("matchLabels", {}).items() <= labels.items()
               for b in budgets):
        failures.append("no PodDisruptionBudget with minAvailable: 1 selecting the operator's pods")
    if not failures:
        print(f"ok   {spec['replicas']} replicas with --leader-elect, lease RBAC, disruption budget")
    return failures


def check_events():
    """The service account's rights on events, through every binding that names it."""
    failures = []
    docs = all_documents()
    (deployment,) = documents(MANIFESTS / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    account, namespace = pod.get("serviceAccountName"), deployment["metadata"]["namespace"]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d.get("kind") in ("Role", "ClusterRole")}
    granted = {}
    for binding in docs:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace", binding["metadata"].get("namespace")) == namespace
                   for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        scope = None if ref["kind"] == "ClusterRole" else binding["metadata"].get("namespace")
        role = roles.get((ref["kind"], scope, ref["name"])) or {}
        for rule in role.get("rules") or []:
            resources = rule.get("resources", [])
            if "events" not in resources and "*" not in resources:
                continue
            for group in rule.get("apiGroups", []):
                granted.setdefault(group, set()).update(rule.get("verbs", []))
    if granted.get("events.k8s.io") != {"create", "patch"}:
        failures.append(f"rbac: {account} gets {sorted(granted.get('events.k8s.io', []))} on "
                        "events.k8s.io events, want exactly create and patch")
    extra = {group: sorted(verbs) for group, verbs in granted.items() if group != "events.k8s.io"}
    if extra:
        failures.append(f"rbac: {account} gets more on events than hang Events need: {extra}")
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    if "--hang-events=false" in (container.get("args") or []) or \
            env.get("RECONCILE_WATCHDOG_HANG_EVENTS") == "false":
        failures.append("deployment: hang Events are turned off")
    if not failures:
        print("ok   hang Events: create and patch on events.k8s.io events, nothing more")
    return failures


def main():
    checks = [
        ("kustomization", check_kustomization),
        ("schemas", check_schemas),
        ("checkov", check_checkov),
        ("hadolint", check_hadolint),
        ("flags", check_flags),
        ("high availability", check_ha),
        ("hang events", check_events),
    ]
    failed = 0
    for name, check in checks:
        print(f"== {name}")
        failures = check()
        for failure in failures:
            print(f"FAIL {failure}")
        failed += bool(failures)
    print(f"manifests: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
