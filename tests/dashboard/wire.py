"""The dashboard page's data as a test reads it: the JSON block, its cases unpacked the way
dashboard.js `unpack` does (orchestrator/dashboard/pack.py says what was packed), for the fields
tests look at: interned strings, axes, checks (summary lines are not sent), cls and repro."""

from __future__ import annotations

import json
import re


def page_data(html: str) -> dict:
    data = json.loads(re.search(r'<script[^>]*type="application/json"[^>]*>(.*?)</script>', html, re.S).group(1))
    p = data["packed"]
    strings = p["strings"]
    for c in data["cases"]:
        for f in p["interned"]:
            if isinstance(c.get(f), int) and not isinstance(c.get(f), bool):
                c[f] = strings[c[f]]
        c["axes"] = {n: strings[v] if n in p["string_axes"] else v for n, v in zip(p["axis_names"], c.pop("a"))}
        c.setdefault("cls", c["state"])
        if c["state"] not in ("pending", "missing"):
            c.setdefault("repro", f"orch repro {c['id']} --matrix {data['run']['matrix']}")
        c["checks"] = [
            dict(zip(p["check_fields"], row + [None] * (len(p["check_fields"]) - len(row))))
            for row in c.get("checks", [])
        ]
        for k in c["checks"]:
            k["name"], k["passed"] = strings[k["name"]], bool(k["passed"])
    return data
