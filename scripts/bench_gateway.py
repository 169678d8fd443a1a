"""The gateway's cost per request, and what sharing generate calls between sessions buys.

1. One reply of a fixed length through HTTP and the OpenAI client, against the same
   engine's generate call, interleaved in one process (median ms, ratio).
2. ``--sessions N`` agents asking at once, ``--waves`` times: replies per second with
   requests batched into shared generate calls (``max_batch = N``) and one at a time
   (``max_batch = 1``), alternating wave by wave.

    PYTHONPATH=. python scripts/bench_gateway.py [--rounds 40] [--tokens 16] [--sessions 8] [--waves 6]

The machine may be shared: compare the ratios, not the ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--waves", type=int, default=6)
    args = ap.parse_args()

    import openai
    import torch

    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.factory import build_rollout_engine
    from asyncflow.engines.hf import load_tokenizer
    from asyncflow.engines.prompts import encode_chat_prompt
    from asyncflow.gateway.server import Gateway
    from asyncflow.toy.tiny import make_tiny_model

    torch.set_num_threads(1)
    model_dir = make_tiny_model(tempfile.mkdtemp(prefix="bench-gateway-"), seed=0)
    tokenizer = load_tokenizer(model_dir)
    engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=4, kv_cache_bytes=1 << 20), model_dir)
    params = SamplingParams(max_new_tokens=args.tokens, stop_token_ids=())  # no stop token: every reply has --tokens tokens
    gateway = Gateway(engine, tokenizer, params, engine_lock=threading.Lock(), max_batch=args.sessions)
    serial = Gateway(engine, tokenizer, params, engine_lock=threading.Lock(), max_batch=1)
    api = openai.OpenAI(base_url=gateway.start("127.0.0.1", 0) + "/v1", api_key="unused", max_retries=0)
    serial_api = openai.OpenAI(base_url=serial.start("127.0.0.1", 0) + "/v1", api_key="unused", max_retries=0)
    question = "what is 12+7?"
    prompt = encode_chat_prompt(tokenizer, question)
    direct, http = [], []
    try:
        for _ in range(args.rounds + 3):  # the first 3 rounds warm up
            t0 = time.perf_counter()
            engine.generate([prompt], params)
            t1 = time.perf_counter()
            api.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
            t2 = time.perf_counter()
            direct.append(t1 - t0)
            http.append(t2 - t1)
        batched_s, serial_s = 0.0, 0.0
        for _ in range(args.waves):
            batched_s += wave(api, args.sessions, question)
            serial_s += wave(serial_api, args.sessions, question)
    finally:
        gateway.close()
        serial.close()
    d, h = statistics.median(direct[3:]) * 1e3, statistics.median(http[3:]) * 1e3
    print(
        f"{args.tokens}-token reply, median of {args.rounds}: engine.generate {d:.1f} ms, gateway (HTTP + OpenAI client) {h:.1f} ms"
    )
    print(f"gateway / direct = {h / d:.2f}x (overhead {h - d:.1f} ms per request)")
    n = args.sessions * args.waves
    print(
        f"{args.sessions} sessions at once, {args.waves} waves: {n / batched_s:.1f} replies/s with shared generate calls, "
        f"{n / serial_s:.1f} one at a time: {serial_s / batched_s:.2f}x"
    )


def wave(api, sessions: int, question: str) -> float:
    """Seconds for ``sessions`` threads to get one reply each, all asking at once."""
    start = threading.Barrier(sessions + 1)

    def ask() -> None:
        start.wait()
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])

    threads = [threading.Thread(target=ask) for _ in range(sessions)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
