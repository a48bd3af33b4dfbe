"""The service's /metrics, scraped and parsed."""

from __future__ import annotations

import re

import httpx

SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? (\S+)$")


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """Every sample, keyed by its name and labels as Prometheus prints them."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for line in response.text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        samples[f"{match.group(1)}{match.group(2) or ''}"] = float(match.group(3))
    return samples
