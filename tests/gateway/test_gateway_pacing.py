"""Pacing at the gateway (real tiny model, real HTTP, the OpenAI client): a new session's
first request is held while the pacer has no room, gets a 503 with Retry-After after
``pace_wait_s``, and goes on as soon as there is room; a session under way is never held."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from asyncflow.gateway.feed import SessionFeed
from asyncflow.gateway.pacing import Pacer

pytestmark = pytest.mark.timeout(120)


def paced_gateway(make_gateway, wait_s: float):
    gw = make_gateway(feed=SessionFeed(2, 60))
    gw.pacer = Pacer(per_step=1, staleness=0, version=gw.engine.version)  # one session ahead at most
    gw.pace_wait_s = wait_s
    return gw


def first_turn(api: openai.OpenAI, session: str, text: str = "12+7="):
    return api.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], user=session)


def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_new_session_without_room_is_held_then_refused_with_retry_after_while_one_under_way_goes_on(make_gateway):
    gw = paced_gateway(make_gateway, wait_s=0.5)
    api = client(gw)
    r1 = first_turn(api, "a")
    with pytest.raises(openai.APIStatusError) as held:
        first_turn(api, "b")
    assert held.value.status_code == 503 and held.value.response.headers["retry-after"] == "5"
    assert "workflow.staleness" in held.value.message and "pace_wait_s" in held.value.message
    chat = [
        {"role": "user", "content": "12+7="},
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "7+1="},
    ]
    r2 = api.chat.completions.create(model="m", messages=chat, user="a")  # under way: never held
    assert r2.model_extra["asyncflow"]["turn"] == 2
    counts = gw.counters()
    assert (counts["gateway/pace_held"], counts["gateway/pace_refused"], counts["gateway/pace_waiting"]) == (1, 1, 0)


def test_a_held_first_request_starts_as_soon_as_there_is_room(make_gateway):
    gw = paced_gateway(make_gateway, wait_s=60.0)
    api = client(gw)
    first_turn(api, "a")
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(first_turn(api, "b")), daemon=True)
    waiter.start()
    while gw.pacer.counts.waiting == 0:  # its first request is held
        time.sleep(0.01)
    assert not answers
    gw.pacer.dropped(1)  # "a" is dropped (no reward in time): room for one
    waiter.join(timeout=60)
    assert answers and answers[0].model_extra["asyncflow"]["session"] == "b"
