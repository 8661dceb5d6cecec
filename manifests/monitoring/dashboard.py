"""The Grafana dashboard of reconcile-watchdog, written as dashboard.json beside this file.

    python3 manifests/monitoring/dashboard.py > manifests/monitoring/dashboard.json

Plain Python (the standard library only), so that it runs anywhere; tests/monitoring.py
fails when dashboard.json differs from what this prints. Every query names metrics of
docs/operations.md#metrics; that test also checks them against what the binary exports.
"""

import json
import sys

UID = "reconcile-watchdog"
# Every query is limited to the chosen namespace(s) and, where it has one, controller(s).
NS = 'namespace=~"$namespace"'
NS_CONTROLLER = f'{NS}, controller=~"$controller"'


def target(expr, legend, ref, **extra):
    return {"datasource": {"type": "prometheus", "uid": "${datasource}"},
            "expr": expr, "legendFormat": legend, "refId": ref, **extra}


def panel(kind, title, description, targets, unit="short", **options):
    """One panel; its position is set by layout()."""
    body = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "targets": [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    body.update(options)
    return body


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def thresholds(*steps):
    """Grafana threshold steps from (value, colour) pairs; the first value is the base."""
    return {"mode": "absolute",
            "steps": [{"color": colour, "value": value} for value, colour in steps]}


def reconcile_panels():
    return [
        row("Reconciles"),
        panel("timeseries", "Reconciles in flight",
              "Reconciles running at the watchdog's latest scan, per controller.",
              [(f"sum by (controller) (reconcile_watchdog_reconciles_in_flight{{{NS_CONTROLLER}}})",
                "{{controller}}")]),
        panel("timeseries", "Reconciles overdue",
              "Reconciles past their deadline at the latest scan, per controller "
              "(alert ReconcileHung).",
              [(f"sum by (controller) (reconcile_watchdog_reconciles_overdue{{{NS_CONTROLLER}}})",
                "{{controller}}")],
              fieldConfig={"defaults": {"unit": "short", "color": {"mode": "palette-classic"},
                                        "thresholds": thresholds((None, "green"), (1, "red"))},
                           "overrides": []}),
        panel("heatmap", "Reconcile durations",
              "How long reconciles took, by duration bucket, for the chosen controllers. "
              "Compare with the deadline (the dashboard's deadline variable, the "
              "--reconcile-deadline of the operator): durations crowding just below it "
              "mean the deadline is too tight.",
              [(f"sum by (le) (increase(reconcile_watchdog_reconcile_duration_seconds_bucket{{{NS_CONTROLLER}}}[$__rate_interval]))",
                "{{le}}")],
              unit="s",
              options={"calculate": False, "yAxis": {"unit": "s"},
                       "cellGap": 1, "color": {"mode": "scheme", "scheme": "Oranges"}}),
        panel("timeseries", "Reconcile duration against the deadline",
              "The 50th and 99th percentile of reconcile durations per controller, and the "
              "deadline (dashboard variable) as a line.",
              [(f"histogram_quantile(0.99, sum by (controller, le) (rate(reconcile_watchdog_reconcile_duration_seconds_bucket{{{NS_CONTROLLER}}}[$__rate_interval])))",
                "p99 {{controller}}"),
               (f"histogram_quantile(0.5, sum by (controller, le) (rate(reconcile_watchdog_reconcile_duration_seconds_bucket{{{NS_CONTROLLER}}}[$__rate_interval])))",
                "p50 {{controller}}"),
               ("vector($deadline)", "deadline")],
              unit="s"),
        panel("timeseries", "Reconcile outcomes",
              "Reconciles that ended, per second, by controller and outcome (ok, error, "
              "panic, cancelled, dropped).",
              [(f"sum by (controller, outcome) (rate(reconcile_watchdog_reconcile_duration_seconds_count{{{NS_CONTROLLER}}}[$__rate_interval]))",
                "{{controller}} {{outcome}}")],
              unit="ops"),
        panel("timeseries", "Hangs, cancellations and escalations",
              "Hung reconciles found (by state: awaiting, in-poll; starved are the victims "
              "of a runtime stall, not hangs of their own), cancellations asked by "
              "--on-hang cancel, and cancellations that failed and escalated to liveness "
              "(alerts ReconcileHangsRecurring, ReconcileCancelEscalated).",
              [(f"sum by (controller, state) (increase(reconcile_watchdog_hangs_total{{{NS_CONTROLLER}}}[$__rate_interval]))",
                "hangs {{controller}} {{state}}"),
               (f"sum by (controller) (increase(reconcile_watchdog_cancellations_total{{{NS_CONTROLLER}}}[$__rate_interval]))",
                "cancellations {{controller}}"),
               (f"sum by (controller) (increase(reconcile_watchdog_escalations_total{{{NS_CONTROLLER}}}[$__rate_interval]))",
                "escalations {{controller}}")],
              fieldConfig={"defaults": {"unit": "short", "custom": {"drawStyle": "bars"}},
                           "overrides": []}),
        panel("timeseries", "Near misses",
              "Reconciles that ended on time but past the near-miss share of their deadline "
              "(--near-miss-threshold, 80% by default), per controller: the next slow one "
              "will be reported hung (alert ReconcileNearMissesRising; /debug/deadlines "
              "suggests a deadline).",
              [(f"sum by (controller) (increase(reconcile_watchdog_near_misses_total{{{NS_CONTROLLER}}}[$__rate_interval]))",
                "{{controller}}")],
              fieldConfig={"defaults": {"unit": "short", "custom": {"drawStyle": "bars"}},
                           "overrides": []}),
    ]


def watchdog_panels():
    return [
        row("Watchdog, runtime and probes"),
        panel("timeseries", "Runtime heartbeat age",
              "Age of the async runtime's heartbeat at each scan, per pod; past "
              "--runtime-stall-threshold (10s by default, the red line) liveness fails "
              "(alert OperatorRuntimeStalled).",
              [(f"max by (pod) (reconcile_watchdog_runtime_heartbeat_age_seconds{{{NS}}})", "{{pod}}")],
              unit="s",
              fieldConfig={"defaults": {"unit": "s",
                                        "custom": {"thresholdsStyle": {"mode": "line"}},
                                        "thresholds": thresholds((None, "green"), (10, "red"))},
                           "overrides": []}),
        panel("state-timeline", "Probe checks",
              "Each health check, per probe (healthz is liveness, readyz readiness): "
              "1 passing, 0 failing, evaluated at scrape time.",
              [(f"min by (probe, check) (reconcile_watchdog_health_check_passing{{{NS}}})",
                "{{probe}} {{check}}")],
              fieldConfig={"defaults": {"unit": "short",
                                        "mappings": [{"type": "value", "options": {
                                            "0": {"text": "failing", "color": "red"},
                                            "1": {"text": "passing", "color": "green"}}}]},
                           "overrides": []}),
        panel("timeseries", "Watchdog scans",
              "Scans per second per pod (one per --watchdog-interval; 0 means the watchdog "
              "stopped, alert ReconcileWatchdogNotScanning) and the 99th percentile of a "
              "scan's duration.",
              [(f"sum by (pod) (rate(reconcile_watchdog_scan_duration_seconds_count{{{NS}}}[$__rate_interval]))",
                "scans/s {{pod}}"),
               (f"histogram_quantile(0.99, sum by (pod, le) (rate(reconcile_watchdog_scan_duration_seconds_bucket{{{NS}}}[$__rate_interval])))",
                "p99 scan {{pod}}")]),
        panel("timeseries", "Watch age",
              "Time since each watch of a controller last showed a sign of life (an event, "
              "a bookmark, a list); bookmarks keep it under about a minute. Past "
              "--watch-stall-threshold (3m by default, the red line) readiness fails "
              "(alert ReconcileWatchSilent).",
              [(f"max by (controller, resource) (reconcile_watchdog_watch_age_seconds{{{NS_CONTROLLER}}})",
                "{{controller}} {{resource}}")],
              unit="s",
              fieldConfig={"defaults": {"unit": "s",
                                        "custom": {"thresholdsStyle": {"mode": "line"}},
                                        "thresholds": thresholds((None, "green"), (180, "red"))},
                           "overrides": []}),
    ]


def runtime_panels():
    return [
        row("Runtime rescues, pauses and dropped reports"),
        panel("timeseries", "Rescues and other wakes",
              "Rescues: idle workers woken because a guarded reconcile held a runtime "
              "worker inside one poll (alert ReconcileBlocksRuntimeWorker; the WARN names "
              "it). Other wakes, by cause, kept timers going beside busy workers: nothing "
              "to fix.",
              [(f"sum by (pod) (increase(reconcile_watchdog_driver_rescues_total{{{NS}}}[$__rate_interval]))",
                "rescues {{pod}}"),
               (f"sum by (pod, cause) (increase(reconcile_watchdog_driver_wakes_total{{{NS}}}[$__rate_interval]))",
                "wakes {{pod}} {{cause}}")],
              fieldConfig={"defaults": {"unit": "short", "custom": {"drawStyle": "bars"}},
                           "overrides": []}),
        panel("timeseries", "Pauses and CPU throttling",
              "Share of the time each pod's cgroup was CPU-throttled, and the share it was "
              "paused (not scheduled past the stall threshold, no verdict for that time); "
              "alert ReconcileWatchdogPausedOrThrottled.",
              [(f"sum by (pod) (rate(reconcile_watchdog_cpu_throttled_seconds_total{{{NS}}}[$__rate_interval]))",
                "throttled {{pod}}"),
               (f"sum by (pod) (rate(reconcile_watchdog_paused_seconds_total{{{NS}}}[$__rate_interval]))",
                "paused {{pod}}")],
              unit="percentunit"),
        panel("timeseries", "Unnamed hangs and dropped Events",
              "Hung reconciles their first report did not name (a mass hang past the report "
              "budget: /debug/reconciles lists them), and hang reports not published as "
              "Events on their objects (queue full, or the API server slow).",
              [(f"sum by (pod) (increase(reconcile_watchdog_hangs_unnamed_total{{{NS}}}[$__rate_interval]))",
                "unnamed hangs {{pod}}"),
               (f"sum by (pod) (increase(reconcile_watchdog_events_dropped_total{{{NS}}}[$__rate_interval]))",
                "dropped Events {{pod}}")],
              fieldConfig={"defaults": {"unit": "short", "custom": {"drawStyle": "bars"}},
                           "overrides": []}),
    ]


def leader_panels():
    return [
        row("Leader election and API server"),
        panel("state-timeline", "Leader",
              "Which identity holds the lease (1) and which follow (0).",
              [(f"max by (identity) (reconcile_watchdog_leader{{{NS}}})", "{{identity}}")],
              fieldConfig={"defaults": {"unit": "short",
                                        "mappings": [{"type": "value", "options": {
                                            "0": {"text": "follower", "color": "blue"},
                                            "1": {"text": "leader", "color": "green"}}}]},
                           "overrides": []}),
        panel("timeseries", "Lease renewal age",
              "Time since each pod's last successful lease renewal; a leader past the "
              "lease duration fails liveness (alert ReconcileWatchdogLeaseRenewalStale).",
              [(f"max by (pod) (reconcile_watchdog_lease_renewal_age_seconds{{{NS}}})", "{{pod}}")],
              unit="s"),
        panel("timeseries", "Lease renewals",
              "Lease renewals per second, by pod and result (success, failure).",
              [(f"sum by (pod, result) (rate(reconcile_watchdog_lease_renewals_total{{{NS}}}[$__rate_interval]))",
                "{{pod}} {{result}}")],
              unit="ops"),
        panel("state-timeline", "API server reachable",
              "Whether each pod's fresh-connection check reaches the API server (readiness "
              "check api-server; alert ReconcileWatchdogApiServerUnreachable).",
              [(f"min by (pod) (reconcile_watchdog_api_server_reachable{{{NS}}})", "{{pod}}")],
              fieldConfig={"defaults": {"unit": "short",
                                        "mappings": [{"type": "value", "options": {
                                            "0": {"text": "unreachable", "color": "red"},
                                            "1": {"text": "reachable", "color": "green"}}}]},
                           "overrides": []}),
    ]


def layout(panels):
    """Rows take a full line; other panels go two to a line, 12 columns by 8 high."""
    x = y = 0
    for i, p in enumerate(panels, start=1):
        p["id"] = i
        if p["type"] == "row":
            y += 0 if x == 0 else 8
            x = 0
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        p["gridPos"] = {"h": 8, "w": 12, "x": x, "y": y}
        x, y = (12, y) if x == 0 else (0, y + 8)
    return panels


def variable_query(name, label, query):
    return {"name": name, "label": label, "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1}


def dashboard():
    return {
        "uid": UID,
        "title": "reconcile-watchdog",
        "description": "Reconciles, hangs, the watchdog, probes and leader election of "
                       "operators that embed reconcile-watchdog (docs/operations.md).",
        "tags": ["reconcile-watchdog", "kubernetes", "operator"],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            variable_query("namespace", "Namespace",
                           "label_values(reconcile_watchdog_scan_duration_seconds_count, namespace)"),
            variable_query("controller", "Controller",
                           'label_values(reconcile_watchdog_reconciles_in_flight{namespace=~"$namespace"}, controller)'),
            {"name": "deadline", "label": "Deadline (s)", "type": "textbox", "query": "300",
             "current": {"text": "300", "value": "300"},
             "description": "The operator's --reconcile-deadline in seconds (run's default: 5m)"},
        ]},
        "panels": layout(reconcile_panels() + watchdog_panels() + runtime_panels()
                         + leader_panels()),
    }


def render():
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
