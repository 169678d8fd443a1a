"""Helpers of the gateway tests: a plain HTTP call (no OpenAI client)."""

import json
import urllib.error
import urllib.request


def call(url: str, path: str, body: bytes | None = None, token: str | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a plain HTTP request (no OpenAI client)."""
    req = urllib.request.Request(url + path, data=body, method="GET" if body is None else "POST")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
