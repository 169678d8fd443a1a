"""cluster.toml: wrong keys and values fail at once, naming the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncflow.config.docs import config_markdown
from asyncflow.config.load import ConfigError, load_config, load_config_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text,message",
    [
        ('[workflow]\nmode = "fast"', "workflow.mode: Invalid enum value 'fast'; use one of 'sync', 'async'"),
        ("[workflow]\nstalenes = 2", "workflow.stalenes: unknown key; did you mean 'staleness'?"),
        ('[rollout.engine]\nkv_cache_bytes = "x"', "rollout.engine.kv_cache_bytes: Expected `int | null`, got `str`"),
        ("[algorithm]\ngroup_size = 1", "algorithm.group_size = 1: grpo compares the responses of one prompt: use at least 2"),
        ("[train]\nnum_ranks = 2", "train.engine.fsdp = False: train.num_ranks = 2 trains data parallel with FSDP2"),
        (
            "[train]\nnum_ranks = 2\nprompts_per_step = 3\n[train.engine]\nfsdp = true",
            "train.prompts_per_step = 3: every rank trains whole prompt groups: use a multiple of train.num_ranks (2)",
        ),
        (
            "[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true\n[planner]\nonline = true",
            "planner.online = True: the online planner moves threads and replicas for a one-rank trainer only",
        ),
        (
            "[train]\nnum_ranks = 2\ndevices = [0]\n[train.engine]\nfsdp = true",
            "train.devices = [0]: give one device per trainer rank (2 ids), or none",
        ),
        ('[[roles]]\nname = "trainer"\ncls = "m:C"', "roles.name = 'trainer': this name belongs to a built-in role"),
        # its replicas would be shard.0, ...: the queue shards' names (the planner's, a rank's, too)
        ('[[roles]]\nname = "shard"\ncls = "m:C"', "roles.name = 'shard': this name belongs to a built-in role"),
        ('[[roles]]\nname = "planner"\ncls = "m:C"', "roles.name = 'planner': this name belongs to a built-in role"),
        ('[[roles]]\nname = "trainer.1"\ncls = "m:C"', "roles.name = 'trainer.1': this name belongs to a built-in role"),
        (
            "[cluster.transport]\nscheme = 'tcp'\nbind_host = '0.0.0.0'",
            "cluster.transport.bind_host = '0.0.0.0' is not loopback: set cluster.transport.tls_dir",
        ),
    ],
)
def test_a_wrong_key_or_value_names_the_key_and_the_fix(text, message, monkeypatch):
    monkeypatch.delenv("ASYNCFLOW_SECRET", raising=False)
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert message in str(info.value)


def test_every_example_config_loads(tiny_dir):
    for path in sorted((ROOT / "examples").glob("*.toml")):
        if path.name in ("gpu.toml", "npu.toml"):  # they name model and data paths of a GPU/NPU machine
            continue
        imported = {"smollm2.toml": ("smollm2-135m", "smollm2"), "gemma3.toml": ("gemma3-270m", "gemma3")}
        if path.name in imported and not (ROOT / "models" / imported[path.name][0]).is_dir():
            # the real model is written by a command, not shipped: a fresh checkout is told that
            # command, and the rest of the file is checked against a stand-in model directory
            with pytest.raises(ConfigError, match=f"afctl model import-gguf {imported[path.name][1]}"):
                load_config(path)
            load_config(path, [f"model.path={str(tiny_dir)!r}"])
            continue
        load_config(path)


def test_set_overrides_change_keys_of_the_file_and_name_a_wrong_one():
    tiny = ROOT / "examples" / "tiny.toml"
    cfg = load_config(
        tiny,
        [
            "train.num_ranks=2",
            "train.engine.fsdp=true",
            "train.devices=[]",
            "workflow.mode=sync",
            "logging.hang_timeout_s = 30",
        ],
    )
    assert cfg.train.num_ranks == 2 and cfg.train.engine.fsdp is True and cfg.workflow.mode == "sync"
    assert cfg.logging.hang_timeout_s == 30.0 and cfg.train.num_steps == 4  # the file's own keys stay
    with pytest.raises(ConfigError, match="train.num_rank: unknown key; did you mean 'num_ranks'"):
        load_config(tiny, ["train.num_rank=2"])
    with pytest.raises(ConfigError, match="train.engine.fsdp = False: train.num_ranks = 2"):
        load_config(tiny, ["train.num_ranks=2"])  # checked like the file
    with pytest.raises(ConfigError, match="write KEY=VALUE"):
        load_config(tiny, ["train.num_ranks"])
    with pytest.raises(ConfigError, match="train.num_steps is a value, not a table"):
        load_config(tiny, ["train.num_steps.x=1"])


def test_docs_config_md_documents_every_key_as_the_code_has_it():
    assert (ROOT / "docs" / "config.md").read_text().strip() == config_markdown().strip(), (
        "docs/config.md is stale: regenerate it with `python -m asyncflow.config.docs --markdown > docs/config.md`"
    )


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text,message",
    [
        ("[rollout.sampling]\ntemperature = -1", "rollout.sampling.temperature = -1: out of range; use a value >= 0"),
        ("[rollout.sampling]\ntop_p = 0", "rollout.sampling.top_p = 0: out of range; use a value > 0 and <= 1"),
        (
            "[rollout.engine]\nkv_cache_fraction = 1.5",
            "rollout.engine.kv_cache_fraction = 1.5: out of range; use a value > 0 and <= 1",
        ),
        ("[train]\nnum_steps = 0", "train.num_steps = 0: out of range; use a value >= 1"),
        ("[train.engine]\nlr_min_ratio = 2", "train.engine.lr_min_ratio = 2: out of range; use a value between 0 and 1"),
        ("[train.engine]\nbetas = [0.9, 1.5]", "train.engine.betas[1] = 1.5: out of range; use a value >= 0 and < 1"),
        ("[rollout]\ndevices = [0, -1]", "rollout.devices[1] = -1: out of range; use a value >= 0"),
        ("[algorithm]\ngamma = 1.5", "algorithm.gamma = 1.5: out of range; use a value between 0 and 1"),
    ],
)
def test_a_value_outside_its_range_names_the_key_and_the_allowed_range(text, message):
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert message in str(info.value)


@pytest.mark.timeout(10)
def test_every_numeric_config_key_has_a_range():
    import typing

    import msgspec

    from asyncflow.config.run import RunConfig

    free = {"EvalConfig.correct_reward", "RoleEntry.reward_weight", "RewardConfig.weights"}  # rewards: any number
    unconstrained, seen = [], set()

    def walk(cls):
        if cls in seen:
            return
        seen.add(cls)
        for name, hint in typing.get_type_hints(cls, include_extras=True).items():
            bare = (
                [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
                if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType)
                else [hint]
            )
            for h in bare:
                inner = typing.get_args(h)[0] if typing.get_origin(h) in (list, tuple) else h
                if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
                    walk(inner)
                elif inner in (int, float) and f"{cls.__name__}.{name}" not in free:
                    unconstrained.append(f"{cls.__name__}.{name}")

    from asyncflow.config.roles import RoleEntry

    walk(RunConfig)
    walk(RoleEntry)
    # [cluster.transport] checks its own values (TransportConfig.validate, core/transport.py)
    assert [k for k in unconstrained if not k.startswith("TransportConfig.")] == []


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "override,message",
    [
        ("train.num_steps=abc", "train.num_steps: Expected `int`, got `str` (in --set train.num_steps=abc)"),
        ("rollout.sampling.temperature=-1", "(in --set rollout.sampling.temperature=-1;"),
        ("train.num_stepz=3", "train.num_stepz: unknown key; did you mean 'num_steps'? (in --set train.num_stepz=3;"),
    ],
)
def test_a_wrong_value_given_with_set_blames_the_set_not_the_file(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "examples" / "tiny.toml", [override])
    assert message in str(info.value)
    assert "tiny.toml" not in str(info.value)
