"""The gateway driven over real HTTP on loopback: the OpenAI client library for chat,
plain urllib for the session routes; a real tiny model generates."""

import json
import urllib.parse

import openai
import pytest
import torch
from gateway_helpers import call

from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine
from asyncflow.engines.prompts import encode_chat_prompt


def client(gw, api_key="unused"):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def test_a_two_turn_conversation_reuses_the_first_reply_token_for_token_and_records_the_model_log_probs(
    make_gateway, tokenizer, tiny_dir, tmp_path
):
    gw = make_gateway()
    api = client(gw)
    assert [m.id for m in api.models.list().data] == [gw.model_name]
    conversation = [{"role": "user", "content": "what is 2+3?"}]
    # a first reply whose text does not spell its tokens again (it holds a special token the text drops): a
    # gateway that re-tokenised the conversation would not give the model its own tokens back. Whether a sampled
    # reply holds one is the sampler's draw: the first such reply of a few sessions is the one continued.
    for first_call in range(20):
        user = f"agent-{first_call}"
        r1 = api.chat.completions.create(model=gw.model_name, messages=conversation, user=user, logprobs=True)
        reply1 = r1.model_extra["asyncflow"]["token_ids"]
        text1 = r1.choices[0].message.content
        if tokenizer(text1, add_special_tokens=False)["input_ids"] != reply1:
            break
    else:
        pytest.fail("none of 20 first replies held a token its text drops: the test needs one")

    conversation += [{"role": "assistant", "content": text1}, {"role": "user", "content": "and 4+4?"}]
    r2 = api.chat.completions.create(model=gw.model_name, messages=conversation, extra_headers={"X-Session-Id": user})
    reply2 = r2.model_extra["asyncflow"]["token_ids"]

    status, t = call(gw.url, f"/v1/asyncflow/sessions/{user}")
    assert status == 200 and t["num_turns"] == 2
    prompt = encode_chat_prompt(tokenizer, "what is 2+3?")
    assert t["prompt_ids"] == prompt
    # the second generate call saw the prompt, then the first reply exactly, then the new message's tokens
    first, second = gw.engine.prompts[first_call][0], gw.engine.prompts[first_call + 1][0]
    assert first == prompt
    assert second[: len(prompt) + len(reply1)] == prompt + reply1
    context = second[len(prompt) + len(reply1) :]
    assert (
        tokenizer.decode(context) == ("" if r1.choices[0].finish_reason == "stop" else "</s>") + "<|user|>and 4+4?<|assistant|>"
    )
    assert t["response_ids"] == reply1 + context + reply2
    assert gw.engine.locked == [True] * (first_call + 2)  # each reply generated under the replica's engine lock (no swap inside)
    assert t["loss_mask"] == [1] * len(reply1) + [0] * len(context) + [1] * len(reply2)
    assert t["token_versions"] == [0] * len(t["response_ids"]) and t["version"] == 0
    assert t["rollout_logp"][: len(reply1)] == pytest.approx([c.logprob for c in r1.choices[0].logprobs.content], abs=1e-6)
    assert all(lp == 0.0 for lp, m in zip(t["rollout_logp"], t["loss_mask"]) if m == 0)
    # the recorded log-probs are the model's on exactly these tokens: the training engine recomputes them
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=1), tiny_dir)
    logp_T = trainer.forward(make_token_batch([t["prompt_ids"]], [t["response_ids"]], pad_token_id=0)).logp[0]
    recomputed = logp_T[len(prompt) : len(prompt) + len(t["response_ids"])]
    mask = torch.tensor(t["loss_mask"], dtype=torch.bool)
    assert torch.allclose(recomputed[mask], torch.tensor(t["rollout_logp"])[mask], atol=1e-4, rtol=0)

    status, row = call(gw.url, f"/v1/asyncflow/sessions/{user}/reward", b'{"reward": 1.5}')
    assert status == 200 and row["reward"] == 1.5
    (line,) = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert json.loads(line) == {**t, "reward": 1.5}
    with pytest.raises(openai.ConflictError, match="finished"):
        api.chat.completions.create(model=gw.model_name, messages=conversation, user=user)


def test_with_a_secret_every_route_refuses_a_client_without_it(make_gateway):
    gw = make_gateway(secret=b"s3cret")
    with pytest.raises(openai.AuthenticationError):
        client(gw, api_key="wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        client(gw, api_key="wrong").models.list()
    assert call(gw.url, "/v1/asyncflow/sessions")[0] == 401
    assert call(gw.url, "/v1/asyncflow/sessions", token="s3cre")[0] == 401
    r = client(gw, api_key="s3cret").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], user="a")
    assert r.choices[0].message.role == "assistant"
    assert call(gw.url, "/v1/asyncflow/sessions", token="s3cret") == (200, {"sessions": ["a"]})


def test_bad_requests_get_a_clear_4xx_and_the_gateway_goes_on(make_gateway):
    gw = make_gateway()
    api = client(gw)
    hi = [{"role": "user", "content": "hi"}]
    bad = [
        (b"{not json", 400, "not JSON"),
        (b'{"messages": []}', 400, "length >= 1"),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "role"),
        (b'{"messages": [{"role": "user", "content": "h\\u00e9"}]}', 400, "does not know"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}', 400, "at most 4 stop"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ""}', 400, "1 to 256 characters"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 3}', 400, "n = 3"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', 400, "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}', 400, "assistant"),
        (b'{"messages": [{"role": "user", "content": "' + b"9" * 600 + b'"}]}', 400, "max_position_embeddings"),
    ]
    for body, status, words in bad:
        got, reply = call(gw.url, "/v1/chat/completions", body)
        assert got == status and words in reply["error"]["message"], (body[:60], got, reply)
    api.chat.completions.create(model="m", messages=hi, user="s")
    with pytest.raises(openai.ConflictError, match="do not repeat"):  # history edited: refused, not re-tokenised
        api.chat.completions.create(model="m", messages=[*hi, {"role": "assistant", "content": "?"}, *hi], user="s")
    assert call(gw.url, "/v1/asyncflow/sessions/nobody")[0] == 404
    assert call(gw.url, "/v1/asyncflow/sessions/s/reward", b'{"reward": "high"}')[0] == 400
    assert call(gw.url, "/v1/asyncflow/sessions/s/reward", b'{"reward": 1}')[0] == 200
    assert call(gw.url, "/v1/asyncflow/sessions/s/reward", b'{"reward": 1}')[0] == 409
    r = api.chat.completions.create(model="m", messages=hi, max_tokens=3)  # and it still serves
    assert r.usage.completion_tokens <= 3 and r.model_extra["asyncflow"]["session"].startswith("anon-")


def test_a_new_session_beyond_max_sessions_drops_the_oldest_finished_one_or_is_refused(make_gateway):
    gw = make_gateway(max_sessions=2)
    api = client(gw)
    hi = [{"role": "user", "content": "hi"}]
    api.chat.completions.create(model="m", messages=hi, user="a", max_tokens=2)
    api.chat.completions.create(model="m", messages=hi, user="b", max_tokens=2)
    with pytest.raises(openai.RateLimitError, match="max_sessions"):
        api.chat.completions.create(model="m", messages=hi, user="c", max_tokens=2)
    assert call(gw.url, "/v1/asyncflow/sessions/a/reward", b'{"reward": 0}')[0] == 200
    api.chat.completions.create(model="m", messages=hi, user="c", max_tokens=2)
    assert sorted(call(gw.url, "/v1/asyncflow/sessions")[1]["sessions"]) == ["b", "c"]


def test_only_the_named_replica_serves_and_it_asks_for_the_secret_when_the_config_requires_it(tiny_dir, tokenizer, tmp_path):
    import threading

    from asyncflow.config.gateway import GatewayConfig
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.factory import build_rollout_engine
    from asyncflow.gateway.replica import serve_for_replica

    engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=2, kv_cache_bytes=1 << 20), tiny_dir)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,))
    on = GatewayConfig(enabled=True, port=0, replica=1, require_secret=True, max_new_tokens=2)
    args = (tmp_path, engine, tokenizer, params, threading.Lock(), b"cluster-secret")
    assert serve_for_replica(GatewayConfig(enabled=False, port=0), 0, *args) is None
    assert serve_for_replica(on, 0, *args) is None  # another replica's
    gw = serve_for_replica(on, 1, *args)
    try:
        info = json.loads((tmp_path / "gateway.json").read_text())
        assert info["url"] == gw.url and info["replica"] == 1
        hi = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError):
            client(gw).chat.completions.create(model="m", messages=hi)
        r = client(gw, api_key="cluster-secret").chat.completions.create(model="m", messages=hi, max_tokens=50, user="u")
        assert r.usage.completion_tokens <= 2  # [rollout.gateway] max_new_tokens caps a request's max_tokens
        assert call(gw.url, "/v1/asyncflow/sessions/u/reward", b'{"reward": 2}', token="cluster-secret")[0] == 200
        assert json.loads((tmp_path / "gateway" / "trajectories.jsonl").read_text())["reward"] == 2
    finally:
        gw.close()


def test_requests_of_different_sessions_waiting_together_share_one_generate_call_and_each_gets_its_own_reply(
    make_gateway, tokenizer, tiny_dir
):
    import threading

    gw = make_gateway()
    questions = ["1+1=", "22+7=", "what is 3*3?", "9-4="]
    replies: dict[str, object] = {}

    def ask(q: str) -> None:
        replies[q] = client(gw).chat.completions.create(model="m", messages=[{"role": "user", "content": q}], user=q)

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    with gw.engine_lock:  # the replica is generating: every request reaches the gateway and waits
        for t in threads:
            t.start()
        with gw.batcher._cv:
            assert gw.batcher._cv.wait_for(lambda: gw.batcher.num_requests == len(questions), timeout=60)
    for t in threads:
        t.join(timeout=60)
    # the batch taken before the lock was free, then all the others together: at most 2 calls for 4 requests
    sizes = [len(call) for call in gw.engine.prompts]
    assert sum(sizes) == len(questions) and len(sizes) <= 2, sizes
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=1), tiny_dir)
    for q in questions:
        t = call(gw.url, "/v1/asyncflow/sessions/" + urllib.parse.quote(q, safe=""))[1]
        assert t["prompt_ids"] == encode_chat_prompt(tokenizer, q)
        assert t["response_ids"] == replies[q].model_extra["asyncflow"]["token_ids"]
        # its reply continues its own prompt: the training engine gives the recorded log-probs on it
        logp_T = trainer.forward(make_token_batch([t["prompt_ids"]], [t["response_ids"]], pad_token_id=0)).logp[0]
        recomputed = logp_T[len(t["prompt_ids"]) : len(t["prompt_ids"]) + len(t["response_ids"])]
        assert torch.allclose(recomputed, torch.tensor(t["rollout_logp"]), atol=1e-4, rtol=0)


def test_a_request_the_engine_refuses_in_a_shared_call_fails_alone(make_gateway):
    import threading

    gw = make_gateway()
    contents = {"ok-1": "1+1=", "too-long": "9" * 600, "ok-2": "2+2="}
    status: dict[str, int] = {}

    def ask(session: str) -> None:
        body = json.dumps({"messages": [{"role": "user", "content": contents[session]}], "user": session}).encode()
        status[session] = call(gw.url, "/v1/chat/completions", body)[0]

    threads = [threading.Thread(target=ask, args=(s,)) for s in contents]
    b = gw.batcher
    with gw.engine_lock:
        threads[0].start()  # taken alone by the batcher, which then waits for the lock
        with b._cv:
            assert b._cv.wait_for(lambda: b.num_requests == 1 and not b._queue, timeout=60)
        for t in threads[1:]:  # these two queue up: one call for both once the lock is free
            t.start()
        with b._cv:
            assert b._cv.wait_for(lambda: b.num_requests == len(contents), timeout=60)
    for t in threads:
        t.join(timeout=60)
    assert [len(p) for p in gw.engine.prompts[:2]] == [1, 2]
    assert status == {"ok-1": 200, "too-long": 400, "ok-2": 200}


def test_a_streamed_request_gets_the_reply_as_server_sent_events_and_is_recorded(make_gateway, tokenizer):
    gw = make_gateway()
    chunks = list(
        client(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "what is 2+3?"}], user="streamed", stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length") and chunks[0].choices[0].finish_reason is None
    ids = chunks[-1].model_extra["asyncflow"]["token_ids"]
    assert text == tokenizer.decode(ids, skip_special_tokens=True) and chunks[-1].usage.completion_tokens == len(ids)
    status, t = call(gw.url, "/v1/asyncflow/sessions/streamed")
    assert status == 200 and t["response_ids"] == ids  # recorded as a plain request is


def test_a_stop_sequence_cuts_the_reply_after_the_token_that_completes_it(make_gateway, tokenizer):
    """The text ends before the sequence (OpenAI's rule); the recorded tokens end with the
    token that completed it, and their log-probs are the model's on exactly those tokens."""
    gw = make_gateway()
    api = client(gw)
    stops = ["1", "2", "a", "e"]  # the untrained tiny model writes random characters: some reply holds one
    for k in range(30):
        r = api.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], user=f"stop-{k}", stop=stops, logprobs=True, max_tokens=24
        )
        ids = r.model_extra["asyncflow"]["token_ids"]
        if r.choices[0].finish_reason == "stop" and any(s in tokenizer.decode(ids) for s in stops):
            break
    else:
        pytest.fail("no reply of 30 held a stop sequence")
    text, whole = r.choices[0].message.content, tokenizer.decode(ids, skip_special_tokens=True)
    assert not any(s in text for s in stops) and whole.startswith(text) and whole[len(text) :] in stops
    assert not any(s in tokenizer.decode(ids[:-1], skip_special_tokens=True) for s in stops)  # the first one completes it
    status, t = call(gw.url, f"/v1/asyncflow/sessions/stop-{k}")
    assert t["response_ids"] == ids and len(t["rollout_logp"]) == len(ids) and r.usage.completion_tokens == len(ids)
    assert t["rollout_logp"] == pytest.approx([c.logprob for c in r.choices[0].logprobs.content], abs=1e-6)
    # the conversation goes on from the recorded tokens
    again = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text}, {"role": "user", "content": "ok"}]
    assert api.chat.completions.create(model="m", messages=again, user=f"stop-{k}").model_extra["asyncflow"]["turn"] == 2
