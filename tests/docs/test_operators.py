"""The operator docs say what the code does (issue 21's doc items that no run can check)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_redis_doc_says_overwrite_keeps_the_fields_not_given():
    text = (DOCS / "redis.md").read_text()
    assert "no field of the old record survives" not in text
    assert "every other field of the old hash stays" in text  # tests/backends/test_redis_cli.py checks it


def test_the_nginx_example_terminates_tls():
    text = (DOCS / "operations.md").read_text()
    example = text.split("An nginx front end", 1)[1].split("\n\n", 2)[1]
    assert "listen 443 ssl" in example and "ssl_certificate " in example and "ssl_certificate_key " in example
    assert re.search(r"return 301 https://", example)


def test_backups_upgrades_and_the_version_are_documented():
    text = (DOCS / "operations.md").read_text()
    section = text.split("## Backups and upgrades", 1)[1].split("\n## ", 1)[0]
    for needle in ("users.json", "jwt.secret", "sessions.db", ".backup", "run.py --version", "pip install -r"):
        assert needle in section, needle


def test_the_metrics_table_lists_every_metric_with_its_labels():
    """docs/operations.md's table is what an operator builds dashboards from: one row per
    metric the server exports, under the name Prometheus shows (counters end in _total),
    with the labels it carries."""
    from prometheus_client.metrics import MetricWrapperBase

    from homeserver.metrics import Metrics

    text = (DOCS / "operations.md").read_text()
    rows = {
        match.group(1): {label.strip() for label in match.group(2).split(",") if label.strip()}
        for match in re.finditer(r"^\| `(homeserver_[a-z_]+)` \|([^|]*)\|", text, re.M)
    }
    exported = {}
    for metric in vars(Metrics()).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            exported[metric._name + suffix] = set(metric._labelnames)
    assert rows == exported
