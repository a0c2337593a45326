"""The shipped Alertmanager configuration (deploy/alertmanager): amtool accepts it, it routes
by severity, and on a real Alertmanager every backend gone is one page.

The alerts posted to Alertmanager are exactly those the rules fire in the promtool case
"case 3: every backend down" (tests/promtool/oncall2_test.yaml), read from that file: the
rules' side of one cause (five pages and two tickets) and Alertmanager's side (one page)
are checked on the same alerts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from stagelens.slo.alertmanager import RECEIVER_PAGE, RECEIVER_TICKET, render_alertmanager
from stagelens.slo.config import SloConfig
from tests._promstack import ALERTMANAGER, WebhookSink, get_json, wait_http
from tests._scaffold import free_port

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "alertmanager" / "alertmanager.yaml"
SECRET = ROOT / "deploy" / "kubernetes" / "alertmanager-secret.yaml"
ONCALL = ROOT / "tests" / "promtool" / "oncall2_test.yaml"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"

needs_amtool = pytest.mark.skipif(not Path(AMTOOL).exists(), reason="amtool not installed")
needs_alertmanager = pytest.mark.skipif(
    not Path(ALERTMANAGER).exists(), reason="prometheus-alertmanager not installed"
)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def case_three_alerts() -> list[dict[str, str]]:
    """Label sets of the alerts firing in promtool's "case 3" at its last evaluation."""
    suite = yaml.safe_load(ONCALL.read_text(encoding="utf-8"))
    (group,) = [g for g in suite["tests"] if g["name"].startswith("case 3:")]
    (check,) = [c for c in group["promql_expr_test"] if c["expr"] == 'ALERTS{alertstate="firing"}']
    alerts = []
    for sample in check["exp_samples"]:
        labels = dict(_LABEL.findall(sample["labels"]))
        del labels["alertstate"]
        alerts.append(labels)
    return alerts


class TestShippedConfig:
    def test_committed_file_is_current(self) -> None:
        """deploy/alertmanager/alertmanager.yaml is what the SLO config renders."""
        assert yaml.safe_load(SHIPPED.read_text()) == render_alertmanager(SloConfig())

    def test_the_kubernetes_secret_carries_the_same_configuration(self) -> None:
        (secret,) = [d for d in yaml.safe_load_all(SECRET.read_text()) if d]
        assert secret["kind"] == "Secret"
        embedded = yaml.safe_load(secret["stringData"]["alertmanager.yaml"])
        assert embedded == yaml.safe_load(SHIPPED.read_text())

    @needs_amtool
    def test_amtool_check_config_accepts_it(self, tmp_path: Path) -> None:
        """`amtool check-config` accepts the shipped file and the Secret's copy."""
        (secret,) = [d for d in yaml.safe_load_all(SECRET.read_text()) if d]
        copy = tmp_path / "alertmanager.yaml"
        copy.write_text(secret["stringData"]["alertmanager.yaml"])
        result = _amtool("check-config", str(SHIPPED), str(copy))
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("SUCCESS") == 2
        assert "3 inhibit rules" in result.stdout

    @needs_amtool
    def test_amtool_check_config_can_fail(self, tmp_path: Path) -> None:
        """The check is no formality: a route to a receiver that does not exist is refused."""
        broken = yaml.safe_load(SHIPPED.read_text())
        broken["route"]["routes"][0]["receiver"] = "nobody"
        path = tmp_path / "broken.yaml"
        path.write_text(yaml.safe_dump(broken))
        assert _amtool("check-config", str(path)).returncode != 0

    @needs_amtool
    @pytest.mark.parametrize(
        ("labels", "receiver"),
        [
            (["severity=page", "alertname=StagelensNoBackendUp"], RECEIVER_PAGE),
            (["severity=ticket", "alertname=StagelensBackendDown"], RECEIVER_TICKET),
            (["alertname=SomethingElse"], RECEIVER_TICKET),
        ],
    )
    def test_routes_by_severity(self, labels: list[str], receiver: str) -> None:
        """Pages go to the page receiver, tickets (and anything unlabelled) to tickets."""
        result = _amtool("config", "routes", "test", f"--config.file={SHIPPED}", *labels)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == receiver


@dataclass
class Alertmanager:
    url: str

    def post(self, alerts: list[dict[str, str]]) -> None:
        now = datetime.now(timezone.utc).isoformat()
        body = json.dumps(
            [{"labels": labels, "annotations": {}, "startsAt": now} for labels in alerts]
        ).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = get_json(f"{self.url}/api/v2/alerts")
        return found


@contextmanager
def shipped_alertmanager(webhook_url: str) -> Iterator[Alertmanager]:
    """A real Alertmanager on the shipped configuration: its inhibitions and routes as
    shipped, its receivers pointed at ``webhook_url`` and its waits cut to a second (the
    shipped 30 s group wait would only make the test slower)."""
    config = yaml.safe_load(SHIPPED.read_text())
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = webhook_url
    config["route"].update(group_wait="1s", group_interval="1s")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="stagelens-am-") as tmp:
        root = Path(tmp)
        (root / "am.yml").write_text(yaml.safe_dump(config))
        with (root / "am.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    ALERTMANAGER,
                    f"--config.file={root / 'am.yml'}",
                    f"--storage.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/-/ready")
                yield Alertmanager(url)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _notified(sink: WebhookSink, receiver: str) -> set[tuple[str, str]]:
    """(alertname, namespace) of every firing alert ``receiver`` was notified of."""
    return {
        (a["labels"]["alertname"], a["labels"].get("namespace", ""))
        for payload in sink.payloads
        if payload.get("receiver") == receiver
        for a in payload["alerts"]
        if a["status"] == "firing"
    }


@needs_alertmanager
class TestInhibitionOnRealAlertmanager:
    def test_every_backend_down_is_one_page(self) -> None:
        """The seven alerts the rules fire when every backend of eu1/stagelens is down reach
        a real Alertmanager: one page (StagelensNoBackendUp) is sent; the four burn pages
        and the two backend tickets are held back, inhibited by it. The same availability
        burn from staging, where the backends are up, still pages: the inhibition is per
        namespace."""
        fired = case_three_alerts()
        names = sorted(a["alertname"] for a in fired)
        assert names.count("StagelensBackendDown") == 2
        assert sum(a["severity"] == "page" for a in fired) == 5
        (cause,) = [a for a in fired if a["alertname"] == "StagelensNoBackendUp"]
        staging = {
            **next(a for a in fired if a["alertname"] == "StagelensAvailabilityBudgetBurn"),
            "namespace": "staging",
        }
        sink = WebhookSink(free_port())
        with sink.running(), shipped_alertmanager(f"http://127.0.0.1:{sink.port}/") as am:
            am.post([cause])
            deadline = time.monotonic() + 30
            while not am.alerts() and time.monotonic() < deadline:
                time.sleep(0.2)
            am.post([a for a in fired if a is not cause] + [staging])
            expected = {
                ("StagelensNoBackendUp", "stagelens"),
                ("StagelensAvailabilityBudgetBurn", "staging"),
            }
            deadline = time.monotonic() + 30
            while _notified(sink, RECEIVER_PAGE) != expected and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(3)  # three more group intervals: nothing else may follow
            states = {
                (a["labels"]["alertname"], a["labels"].get("instance", "")): a["status"]
                for a in am.alerts()
                if a["labels"].get("namespace") == "stagelens"
            }
        assert _notified(sink, RECEIVER_PAGE) == expected
        assert _notified(sink, RECEIVER_TICKET) == set()
        inhibited = {key for key, status in states.items() if status["inhibitedBy"]}
        assert inhibited == {
            (a["alertname"], a.get("instance", "")) for a in fired if a is not cause
        }
        assert all(
            status["state"] == "suppressed" for key, status in states.items() if key in inhibited
        )
