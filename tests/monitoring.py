"""Checks of manifests/monitoring/, run by tests/monitoring.sh in the test venv.

1. rules: every PrometheusRule under manifests/monitoring/ passes `promtool check rules`;
   every alert has a severity, a summary, a description and a runbook_url whose anchor
   is a heading of docs/operations.md, and its annotations use only labels it keeps.
2. rule tests: `promtool test rules` on tests/monitoring/NAME.test.yaml for the
   PrometheusRule NAME (its groups extracted, annotations left out: promtool would
   otherwise want every annotation's text repeated in each case). Every alert has a case
   where it fires and one where it stays silent.
3. dashboard: manifests/monitoring/dashboard.json is what dashboard.py prints; its
   panels have unique ids, a query and a description each, and do not overlap.
4. exported: every metric an alert or a dashboard query names is one the binary
   (RECONCILE_WATCHDOG_BIN) exports: `demo`'s /metrics is scraped, and `run
   --leader-elect`'s against the API emulator (tests/support/emulator.py), which adds
   the API server and leader election series `demo` has no use for.
"""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
MONITORING = ROOT / "manifests" / "monitoring"
CASES = ROOT / "tests" / "monitoring"
OPERATIONS = ROOT / "docs" / "operations.md"
# The install with the monitoring component, as an overlay adds it.
OVERLAY = CASES / "overlay"

EMULATOR = ROOT / "tests" / "support" / "emulator.py"
# The series only `run --leader-elect` against an API server has: scraped until all show.
RUN_ONLY = {
    "reconcile_watchdog_api_server_reachable",
    "reconcile_watchdog_api_server_unreachable_seconds_total",
    "reconcile_watchdog_leader",
    "reconcile_watchdog_lease_renewals_total",
    "reconcile_watchdog_lease_renewal_age_seconds",
    "reconcile_watchdog_watch_age_seconds",
}
SEVERITIES = {"critical", "warning", "info"}
METRIC = re.compile(r"\breconcile_watchdog_[a-z0-9_]+")


def relative(path):
    return pathlib.Path(path).relative_to(ROOT).as_posix()


def promtool():
    return shutil.which("promtool") or "promtool"


def prometheus_rules():
    """(path, PrometheusRule document) for every PrometheusRule under manifests/monitoring/."""
    found = []
    for path in sorted(MONITORING.rglob("*.yaml")):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule":
                    found.append((path, doc))
    return found


def alerts(doc):
    return [r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r]


def anchors(markdown):
    """GitHub's anchors of the headings of a Markdown file."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            found.add(title.replace(" ", "-"))
    return found


def check_alert(where, rule, docs_anchors):
    failures = []
    name = rule["alert"]
    if (rule.get("labels") or {}).get("severity") not in SEVERITIES:
        failures.append(f"{where}: {name}: severity is not one of {sorted(SEVERITIES)}")
    annotations = rule.get("annotations") or {}
    for key in ("summary", "description", "runbook_url"):
        if not str(annotations.get(key, "")).strip():
            failures.append(f"{where}: {name}: no {key} annotation")
    runbook = str(annotations.get("runbook_url", ""))
    page, _, anchor = runbook.partition("#")
    if page != "docs/operations.md" or anchor not in docs_anchors:
        failures.append(f"{where}: {name}: runbook_url {runbook!r} is not a heading of "
                        f"docs/operations.md")
    # A label the expression aggregates away renders as nothing.
    for label in re.findall(r"\$labels\.(\w+)", " ".join(map(str, annotations.values()))):
        if not re.search(rf"\b{label}\b", rule["expr"]):
            failures.append(f"{where}: {name}: annotations use $labels.{label}, "
                            f"which its expression does not keep")
    return failures


def check_rules(work):
    failures = []
    docs_anchors = anchors(OPERATIONS.read_text())
    rules = prometheus_rules()
    if not rules:
        return [f"{relative(MONITORING)}: no PrometheusRule found"]
    for path, doc in rules:
        where = f"{relative(path)}: {doc['metadata']['name']}"
        for rule in alerts(doc):
            failures += check_alert(where, rule, docs_anchors)
        full = work / f"{doc['metadata']['name']}.full.yaml"
        full.write_text(yaml.safe_dump(doc["spec"], sort_keys=False))
        run = subprocess.run([promtool(), "check", "rules", str(full)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            failures.append(f"{where}: promtool check rules: {(run.stdout + run.stderr).strip()}")
        else:
            print(f"ok   promtool check rules {where}: {len(alerts(doc))} alerts")
    return failures


def check_rule_tests(work):
    failures = []
    for path, doc in prometheus_rules():
        name = doc["metadata"]["name"]
        where = f"{relative(path)}: {name}"
        cases = CASES / f"{name}.test.yaml"
        if not cases.exists():
            failures.append(f"{where}: no promtool tests ({relative(cases)})")
            continue
        spec = {"groups": [
            {**group, "rules": [{k: v for k, v in r.items() if k != "annotations"}
                                for r in group["rules"]]}
            for group in doc["spec"]["groups"]
        ]}
        (work / f"{name}.rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        shutil.copy(cases, work / cases.name)
        # Every alert fires in some case and stays silent in another.
        with open(cases) as f:
            tests = yaml.safe_load(f)["tests"]
        expectations = [e for t in tests for e in t.get("alert_rule_test") or []]
        for rule in alerts(doc):
            mine = [e for e in expectations if e["alertname"] == rule["alert"]]
            if not any(e.get("exp_alerts") for e in mine):
                failures.append(f"{relative(cases)}: no case where {rule['alert']} fires")
            if not any(not e.get("exp_alerts") for e in mine):
                failures.append(f"{relative(cases)}: no case where {rule['alert']} stays silent")
        run = subprocess.run([promtool(), "test", "rules", cases.name],
                             cwd=work, capture_output=True, text=True)
        if run.returncode != 0:
            failures.append(f"{relative(cases)}: promtool test rules failed:\n"
                            f"{(run.stdout + run.stderr).strip()}")
        else:
            print(f"ok   promtool test rules {relative(cases)}: {len(tests)} cases")
    return failures


def dashboard_module():
    sys.path.insert(0, str(MONITORING))
    try:
        import dashboard
    finally:
        sys.path.pop(0)
    return dashboard


def check_dashboard():
    expected = dashboard_module().render()
    actual = (MONITORING / "dashboard.json").read_text()
    if actual != expected:
        return [f"{relative(MONITORING / 'dashboard.json')} has drifted from dashboard.py; "
                f"regenerate it: python3 manifests/monitoring/dashboard.py > "
                f"manifests/monitoring/dashboard.json"]
    print(f"ok   {relative(MONITORING / 'dashboard.json')} is what dashboard.py prints")
    return check_dashboard_layout(json.loads(actual))


def check_dashboard_layout(dashboard):
    """Unique panel ids, a query in every panel, no two panels on the same grid cell."""
    failures, cells, ids = [], {}, set()
    for p in dashboard["panels"]:
        where = f"dashboard panel {p.get('id')} {p.get('title')!r}"
        if p["id"] in ids:
            failures.append(f"{where}: its id is not unique")
        ids.add(p["id"])
        if p["type"] != "row" and not (p.get("targets") and p.get("description")):
            failures.append(f"{where}: no query or no description")
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            failures.append(f"{where}: wider than the grid's 24 columns")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    failures.append(f"{where}: overlaps panel {cells[(x, y)]}")
                    break
                cells[(x, y)] = p["id"]
    if not failures:
        print(f"ok   dashboard: {len(ids)} panels, ids unique, none overlapping")
    return failures


def dashboard_queries(dashboard):
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return queries


def binary_env():
    """The environment without RECONCILE_WATCHDOG_ variables (flags come from the tests)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_WATCHDOG_")}


def sample_names(text):
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def scrape_until(url, wanted, what):
    """Sample names of /metrics at `url`, once `wanted` are all among them (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            text = ""
        names = sample_names(text)
        if wanted <= names:
            return names
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {sorted(wanted - names)} not in /metrics after 60s:\n{text}")
        time.sleep(0.2)


def scrape_demo():
    """Sample names of `demo`'s /metrics, once every controller has its series."""
    binary = os.environ["RECONCILE_WATCHDOG_BIN"]
    demo = subprocess.Popen(
        [binary, "demo", "--duration", "2m", "--health-probe-bind-address", "127.0.0.1:0",
         "--metrics-bind-address", "127.0.0.1:0", "--hang-kind", "none"],
        env=binary_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        for line in demo.stdout:
            if line.startswith("metrics: "):
                url = line.removeprefix("metrics: ").strip()
                break
        if not url or not url.startswith("http://"):
            raise RuntimeError(f"demo printed no metrics URL (got {url!r})")
        # The per-controller series exist once demo's controllers have reconciled.
        return scrape_until(url, {"reconcile_watchdog_reconcile_duration_seconds_count"}, "demo")
    finally:
        demo.kill()
        demo.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_run():
    """Sample names of `run --leader-elect`'s /metrics against the API emulator, once it
    leads and has checked the API server."""
    binary = os.environ["RECONCILE_WATCHDOG_BIN"]
    with tempfile.TemporaryDirectory(prefix="monitoring-run-") as work:
        emulator = subprocess.Popen(
            [sys.executable, str(EMULATOR), "--port", "0"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        operator = None
        try:
            line = emulator.stdout.readline().strip()
            if not line.startswith("listening on http://"):
                raise RuntimeError(f"the emulator did not start (it said {line!r})")
            server = line.removeprefix("listening on ")
            kubeconfig = pathlib.Path(work) / "kubeconfig"
            kubeconfig.write_text(
                "apiVersion: v1\nkind: Config\n"
                f"clusters:\n- name: kmock\n  cluster:\n    server: {server}\n"
                "users:\n- name: kmock\n  user: {}\n"
                "contexts:\n- name: kmock\n  context:\n    cluster: kmock\n    user: kmock\n"
                "current-context: kmock\n")
            metrics = f"127.0.0.1:{free_port()}"
            env = binary_env() | {"KUBECONFIG": str(kubeconfig)}
            operator = subprocess.Popen(
                [binary, "run", "--health-probe-bind-address", "127.0.0.1:0",
                 "--metrics-bind-address", metrics, "--debug-bind-address", "0",
                 "--api-server-check-interval", "1s", "--namespace", "default",
                 "--leader-elect", "--leader-elect-resource-namespace", "default",
                 "--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s",
                 "--leader-elect-retry-period", "1s"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            return scrape_until(f"http://{metrics}/metrics", RUN_ONLY, "run --leader-elect")
        finally:
            for process in (operator, emulator):
                if process is not None:
                    process.kill()
                    process.wait()


def built_rules():
    """The PrometheusRules the overlay (the install with the component) builds."""
    kubectl = pathlib.Path(sys.executable).parent / "kubectl"
    run = subprocess.run([str(kubectl), "kustomize", relative(OVERLAY)],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(run.stdout) if d and d["kind"] == "PrometheusRule"]


# Series the binary exports only where the machine has what they read (cgroup v2's cpu
# controller), or only once what they count has happened (a labelled family has no series
# before its first wake), each with the file that registers it and the name it registers:
# checked there when the scrapes lack it.
WHERE_AVAILABLE = {
    "reconcile_watchdog_cpu_throttled_seconds_total":
        ("lib/src/metrics/collectors.rs", '"cpu_throttled_seconds"'),
    "reconcile_watchdog_driver_wakes_total":
        ("lib/src/metrics/mod.rs", '"driver_wakes"'),
}


def check_exported():
    failures = []
    demo = scrape_demo()
    print(f"ok   demo exports {len(demo)} sample names")
    run = scrape_run()
    print(f"ok   run --leader-elect exports {len(run)} sample names")
    exported = demo | run
    for metric, (source, registered) in WHERE_AVAILABLE.items():
        if metric not in exported:
            if registered in (ROOT / source).read_text():
                print(f"ok   {metric}: not exported in these scrapes; {source} registers it")
                exported.add(metric)
            else:
                failures.append(f"{metric}: {source} does not register {registered}")
    installed = {r["alert"] for doc in built_rules() for r in alerts(doc)}
    if not installed:
        failures.append(f"{relative(OVERLAY)} builds no alert")
    named = []
    for path, doc in prometheus_rules():
        for rule in alerts(doc):
            what = f"alert {rule['alert']} ({relative(path)})"
            if rule["alert"] not in installed:
                failures.append(f"{what}: not installed by {relative(OVERLAY)}")
            named.append((what, rule["expr"]))
    dashboard = dashboard_module().dashboard()
    named += [(f"dashboard query {q!r}", q) for q in dashboard_queries(dashboard)]
    for what, expr in named:
        metrics = set(METRIC.findall(expr))
        if not metrics and what.startswith("alert"):
            failures.append(f"{what}: names no reconcile_watchdog_ metric")
        # Histogram and counter samples are named with their suffix, as in the queries.
        for metric in sorted(metrics - exported):
            failures.append(f"{what}: names {metric}, which the binary does not export")
    if not failures:
        print(f"ok   {len(named)} alerts and dashboard queries name exported metrics "
              f"({len(installed)} alerts installed by the component)")
    return failures


def main():
    failed = 0
    with tempfile.TemporaryDirectory(prefix="monitoring-") as work:
        work = pathlib.Path(work)
        checks = [
            ("rules", lambda: check_rules(work)),
            ("rule tests", lambda: check_rule_tests(work)),
            ("dashboard", check_dashboard),
            ("exported", check_exported),
        ]
        for name, check in checks:
            print(f"== {name}")
            failures = check()
            for failure in failures:
                print(f"FAIL {failure}")
            failed += bool(failures)
    print(f"monitoring: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
