"""Peak memory of one gateway replica process under concurrent maximal requests.

A child process serves one gateway (the tiny model, a native engine, ``max_request_bytes``
1 MiB as a run's default) and nothing else; this process sends ``--requests`` chat
requests at once, each a body just under ``max_request_bytes`` (one user message the
tiny model's tokenizer can spell), and reads the child's resident memory from
``/proc/<pid>/status``: before (``VmRSS``), the peak while they were served (``VmHWM``,
reset through ``/proc/<pid>/clear_refs`` just before they are sent) and after.

    PYTHONPATH=. python scripts/gateway_memory.py [--requests 8] [--json]

Run with another checkout's ``PYTHONPATH`` to measure its code (the child inherits it).
The last line with ``--json`` is one JSON object.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

MAX_REQUEST_BYTES = 1 << 20


def serve(url_file: Path) -> None:
    """The child: one gateway on a free port until stdin closes."""
    import torch

    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.factory import build_rollout_engine
    from asyncflow.engines.hf import load_tokenizer
    from asyncflow.gateway.server import Gateway
    from asyncflow.toy.tiny import make_tiny_model

    torch.set_num_threads(1)
    model_dir = make_tiny_model(Path(tempfile.mkdtemp(prefix="af-gwmem-")), arch="qwen2", seed=0)
    tokenizer = load_tokenizer(model_dir)
    engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=8, kv_cache_bytes=1 << 22), model_dir)
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    kw = {}
    if "context_tokens" in inspect.signature(Gateway).parameters:  # code that knows the model's context
        kw["context_tokens"] = json.loads((Path(model_dir) / "config.json").read_text())["max_position_embeddings"]
    gw = Gateway(engine, tokenizer, params, engine_lock=threading.Lock(), max_request_bytes=MAX_REQUEST_BYTES, **kw)
    url_file.write_text(gw.start("127.0.0.1", 0))
    sys.stdin.read()  # until the parent closes it
    gw.close()


def status_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def post(url: str, body: bytes, out: list, i: int) -> None:
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out[i] = (r.status, "")
    except urllib.error.HTTPError as e:
        out[i] = (e.code, json.loads(e.read())["error"]["message"][:160])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(Path(args.serve))
        return
    url_file = Path(tempfile.mkdtemp(prefix="af-gwmem-")) / "url"
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(url_file)], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not url_file.exists() or not url_file.read_text():
            if child.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the gateway process did not start")
            time.sleep(0.1)
        url = url_file.read_text()
        envelope = len(json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]}))
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "1" * (MAX_REQUEST_BYTES - envelope - 16)}]})
        before = status_kb(child.pid)
        Path(f"/proc/{child.pid}/clear_refs").write_text("5")  # VmHWM from here on
        replies: list = [None] * args.requests
        threads = [threading.Thread(target=post, args=(url, body.encode(), replies, i)) for i in range(args.requests)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall_s = time.monotonic() - started
        after = status_kb(child.pid)
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=60)
    result = {
        "code": os.environ.get("PYTHONPATH", ""),
        "requests": args.requests,
        "body_bytes": len(body),
        "rss_before_mb": round(before["VmRSS"] / 1024, 1),
        "peak_rss_mb": round(after["VmHWM"] / 1024, 1),
        "rss_after_mb": round(after["VmRSS"] / 1024, 1),
        "wall_s": round(wall_s, 2),
        "statuses": sorted({str(s) for s, _ in replies}),
        "message": replies[0][1],
    }
    for k, v in result.items():
        print(f"{k}: {v}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
