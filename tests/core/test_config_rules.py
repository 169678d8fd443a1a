"""Config rules declared on the schema: a constraint on each field, one ``check`` per
section for rules between fields, and the file system checked apart from both."""

from __future__ import annotations

import typing

import msgspec
import pytest

from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.config.roles import RoleEntry
from asyncflow.config.run import RunConfig, check_paths, validate
from asyncflow.core import schema

# One value outside its field's constraint in every section (and the top level).
OUT_OF_RANGE = [
    ("seed = -1", "seed = -1: out of range; use a value >= 0", "seed at the top level, or --set seed="),
    (
        "[model]\ntiny_warm_start_steps = -1",
        "model.tiny_warm_start_steps = -1: out of range; use a value >= 0",
        "[model] tiny_warm_start_steps",
    ),
    ("[data]\nnum_prompts = 0", "data.num_prompts = 0: out of range; use a value >= 1", "[data] num_prompts"),
    ("[env]\nmax_turns = 0", "env.max_turns = 0: out of range; use a value >= 1", "[env] max_turns"),
    (
        "[algorithm.loss]\nclip_low = 0",
        "algorithm.loss.clip_low = 0: out of range; use a value > 0 and < 1",
        "[algorithm.loss] clip_low",
    ),
    (
        "[algorithm]\ndynamic_sampling_max_rounds = -1",
        "algorithm.dynamic_sampling_max_rounds = -1: out of range; use a value between 0 and 64",
        "[algorithm] dynamic_sampling_max_rounds",
    ),
    (
        "[algorithm]\ndynamic_sampling_max_rounds = 65",
        "algorithm.dynamic_sampling_max_rounds = 65: out of range; use a value between 0 and 64",
        "[algorithm] dynamic_sampling_max_rounds",
    ),
    ("[rollout]\nnum_replicas = 0", "rollout.num_replicas = 0: out of range; use a value >= 1", "[rollout] num_replicas"),
    (
        "[rollout.engine]\nmax_batch_size = 0",
        "rollout.engine.max_batch_size = 0: out of range; use a value >= 1",
        "--set rollout.engine.max_batch_size=",
    ),
    (
        "[rollout.sampling]\nmax_new_tokens = 0",
        "rollout.sampling.max_new_tokens = 0: out of range",
        "[rollout.sampling] max_new_tokens",
    ),
    ("[rollout.gateway]\nport = 70000", "rollout.gateway.port = 70000: out of range", "[rollout.gateway] port"),
    (
        "[rollout.gateway]\nrequest_timeout_s = 0",
        "rollout.gateway.request_timeout_s = 0: out of range",
        "[rollout.gateway] request_timeout_s",
    ),
    (
        "[reference]\nmicro_batch_size = 0",
        "reference.micro_batch_size = 0: out of range; use a value >= 1",
        "[reference] micro_batch_size",
    ),
    ("[reward]\nbatch_size = 0", "reward.batch_size = 0: out of range; use a value >= 1", "[reward] batch_size"),
    ("[critic.engine]\nlr = 0", "critic.engine.lr = 0: out of range; use a value > 0", "[critic.engine] lr"),
    (
        "[rollout.engine.emulated]\nrollout_tp = 0",
        "rollout.engine.emulated.rollout_tp = 0: out of range; use a value >= 1",
        "[rollout.engine.emulated] rollout_tp",
    ),
    (
        "[train.engine.emulated]\nrollout_tp = 0",
        "train.engine.emulated.rollout_tp = 0: out of range; use a value >= 1",
        "[train.engine.emulated] rollout_tp",
    ),
    (
        "[train.engine.emulated]\ntrain_tp = 0",
        "train.engine.emulated.train_tp = 0: out of range; use a value >= 1",
        "[train.engine.emulated] train_tp",
    ),
    (
        "[train.engine.emulated]\ntrain_pp = 0",
        "train.engine.emulated.train_pp = 0: out of range; use a value >= 1",
        "[train.engine.emulated] train_pp",
    ),
    (
        "[critic.engine.emulated]\nrollout_tp = 0",
        "critic.engine.emulated.rollout_tp = 0: out of range; use a value >= 1",
        "[critic.engine.emulated] rollout_tp",
    ),
    (
        "[train]\nnum_steps = 0",
        "train.num_steps = 0: out of range; use a value >= 1",
        "set it in [train] num_steps, or --set train.num_steps=",
    ),
    ("[train.engine]\nmicro_batch_size = 0", "train.engine.micro_batch_size = 0: out of range", "[train.engine]"),
    ("[eval]\nk = 0", "eval.k = 0: out of range; use a value >= 1", "[eval] k"),
    (
        "[train.engine.lora]\nalpha = 0",
        "train.engine.lora.alpha = 0: out of range; use a value > 0",
        "[train.engine.lora] alpha",
    ),
    (
        "[critic.engine.lora]\nrank = -1",
        "critic.engine.lora.rank = -1: out of range; use a value >= 0",
        "[critic.engine.lora] rank",
    ),
    (
        "[queue]\ninline_max_bytes = -1",
        "queue.inline_max_bytes = -1: out of range; use a value between 0 and 1048576",
        "[queue] inline_max_bytes",
    ),
    (
        "[workflow]\nweight_timeout_s = 0",
        "workflow.weight_timeout_s = 0: out of range; use a value > 0",
        "[workflow] weight_timeout_s",
    ),
    (
        "[cluster]\nthreads_per_process = 0",
        "cluster.threads_per_process = 0: out of range; use a value >= 1",
        "[cluster] threads_per_process",
    ),
    (
        "[cluster]\npin_only_when_idle = 3",
        "cluster.pin_only_when_idle: Expected `bool`, got `int`",
        "[cluster] pin_only_when_idle",
    ),
    (
        "[cluster.transport]\nmax_message_bytes = 0",
        "cluster.transport.max_message_bytes = 0: out of range; use a value > 0",
        "[cluster.transport] max_message_bytes",
    ),
    (
        "[logging]\ntrace_every_s = -1",
        "logging.trace_every_s = -1: out of range; use a value between 0 and 1000000.0",
        "[logging] trace_every_s",
    ),
    ("[planner]\npatience_steps = 0", "planner.patience_steps = 0: out of range; use a value >= 1", "[planner] patience_steps"),
    (
        "[reward_model]\nnum_replicas = 0",
        "reward_model.num_replicas = 0: out of range; use a value >= 1",
        "[reward_model] num_replicas",
    ),
    (
        '[[roles]]\nname = "judge"\ncls = "m:C"\nreward_weight = "high"',
        "roles[0].reward_weight: Expected `float`, got `str`",
        "[[roles]] reward_weight",
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text,message,where", OUT_OF_RANGE, ids=[t.split("\n")[0] for t, _, _ in OUT_OF_RANGE])
def test_a_value_outside_its_field_constraint_is_refused_naming_the_key_and_where_to_set_it(text, message, where):
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert message in str(info.value)
    assert where in str(info.value)


def test_every_section_of_the_schema_has_a_bad_value_case_above():
    run = RunConfig(roles=[RoleEntry(name="a", cls="m:C")])
    sections = {
        path.split("[")[0]
        for path, section in schema.sections(run)
        if any(not isinstance(getattr(section, f), msgspec.Struct) for f in section.__struct_fields__)
    }
    assert {"", "train", "train.engine", "cluster.transport", "roles"} <= sections  # [critic] has no keys of its own
    covered = set()
    for _, message, _ in OUT_OF_RANGE:
        key = message.split(" ")[0].split(":")[0]
        covered.add(key.rpartition(".")[0].split("[")[0])
    assert sections - covered == set()


# One broken rule between fields per section that has one: the key it blames, and the fix.
CROSS_FIELD = [
    ("[data]\npath = 'prompts.csv'", "data.path = 'prompts.csv': use a .jsonl or .parquet file"),
    ("[algorithm]\nis_mask_high = 0.5", "algorithm.is_mask_high = 0.5: use 0 (no upper bound)"),
    ("[reward]\nweights = [1.0, 2.0]", "reward.weights = [1.0, 2.0]: give one weight per function (1)"),
    ("[reward]\nfunctions = []", "reward.functions = []: nothing would score the responses"),
    (
        "[reward]\nplacement = 'rollout'\n[env]\npath = 'asyncflow.envs.calc:CalcEnv'",
        "reward.placement = 'rollout': the rollout scores only single-turn rows",
    ),
    (
        "[algorithm]\nname = 'ppo'\n[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true",
        "critic.engine.fsdp = False: the PPO critic trains on the same 2 ranks",
    ),
    ("[train]\nnum_ranks = 2", "train.engine.fsdp = False: train.num_ranks = 2 trains data parallel"),
    (
        "[eval]\nevery_steps = 1\nmode = 'pass_at_k'\n[rollout.sampling]\ntemperature = 0",
        "eval.mode = 'pass_at_k': pass_at_k samples at rollout.sampling.temperature, which is 0",
    ),
    ("[queue]\ncapacity_rows = 10", "queue.capacity_rows = 10: must hold at least one global batch (64 rows)"),
    (
        "[algorithm]\ndynamic_sampling = true\ndynamic_sampling_max_rounds = 2\n[queue]\ncapacity_rows = 200",
        "queue.capacity_rows = 200: with algorithm.dynamic_sampling_max_rounds > 0 the queue keeps 192 rows free for "
        "refill rounds: use at least 320 or 0 (automatic)",
    ),
    ("[rollout]\ndevices = [0, 1]", "rollout.devices = [0, 1]: give one device id per worker (1)"),
    (
        "[algorithm]\nkl_coef = 0.1\n[reference]\nnum_workers = 2\ndevices = [3]",
        "reference.devices = [3]: give one device id per worker (2)",
    ),
    ("[cluster]\nlauncher = 'ray'\npin_trainer_cores = 2", "cluster.pin_trainer_cores = 2: pins cores of this machine"),
    (
        "[workflow]\nmode = 'async'\n[cluster]\npin_trainer_cores = 1\n[train.engine]\nnum_threads = 2",
        "cluster.pin_trainer_cores = 1: the trainer would run 2 threads per rank on 1 pinned core(s)",
    ),
    (
        "[rollout]\nnum_replicas = 5\n[planner]\nonline = true",
        "planner.max_rollout_replicas = 4: the online planner starts from rollout.num_replicas = 5 replicas",
    ),
    (
        "[rollout.engine]\nkv_cache_bytes = 1000000\nkv_cache_fraction = 0.5",
        "rollout.engine.kv_cache_fraction = 0.5: set kv_cache_bytes or kv_cache_fraction, not both",
    ),
    (
        '[[roles]]\nname = "a"\ncls = "m:C"\n[[roles]]\nname = "a"\ncls = "m:D"',
        "roles.name = ['a', 'a']: role names must be unique",
    ),
    (
        '[[roles]]\nname = "judge"\ncls = "m:C"\nreward_column = "score"',
        "roles.reward_column = 'score': role 'judge' must also set `task`",
    ),
    (
        "[reward_model]\nenabled = true\nkind = 'judge'\ntemplate = 'Score: {prompt}'",
        "reward_model.template = 'Score: {prompt}': the judge must see the response: put {response} in the template",
    ),
    (
        "[reward_model]\nenabled = true\nkind = 'judge'\ntemplate = '{response} {score}'",
        "reward_model.template = '{response} {score}': not a format string of {prompt}, {response}, {answer}",
    ),
    (
        "[reward_model]\nenabled = true\ndevices = [0, 1]",
        "reward_model.devices = [0, 1]: give one device id per worker (1)",
    ),
    (
        '[reward_model]\nenabled = true\n[[roles]]\nname = "judge"\ncls = "m:C"\ntask = "j"\nreward_column = "rm_score"',
        "roles.reward_column = 'rm_score': the reward-model role puts this column: choose another",
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text,message", CROSS_FIELD, ids=[m.split(" ")[0] for _, m in CROSS_FIELD])
def test_a_broken_rule_between_fields_is_refused_naming_the_key_its_value_and_the_fix(text, message):
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert message in str(info.value)


def test_a_section_check_names_its_key_relative_to_the_section_and_the_tree_adds_the_path():
    class Inner(msgspec.Struct, kw_only=True):
        size: int = 0

        def check(self, run: object) -> None:
            if self.size == 3:
                raise schema.Refused("size", "three is refused")

    class Outer(msgspec.Struct, kw_only=True):
        inner: list[Inner] = msgspec.field(default_factory=list)

    schema.check_tree(Outer(inner=[Inner(size=1)]))
    with pytest.raises(schema.ConfigError, match=r"^inner\[1\]\.size = 3: three is refused$"):
        schema.check_tree(Outer(inner=[Inner(size=1), Inner(size=3)]))


def test_the_schema_rules_never_read_the_file_system_and_check_paths_does():
    cfg = RunConfig()
    cfg.model.path = "/no/such/model"
    cfg.data.path = "/no/such/data.jsonl"
    validate(cfg)  # the schema's rules pass: the paths are well formed
    with pytest.raises(ConfigError, match=r"model.path = '/no/such/model': no such directory"):
        check_paths(cfg)
    cfg.model.path = ""
    with pytest.raises(ConfigError, match=r"data.path = '/no/such/data.jsonl': no such file"):
        check_paths(cfg)


def test_every_key_of_the_schema_carries_a_description_on_its_field():
    missing, seen = [], set()

    def walk(cls: type) -> None:
        if cls in seen:
            return
        seen.add(cls)
        hints = typing.get_type_hints(cls, include_extras=True)
        for field in msgspec.inspect.type_info(cls).fields:
            sub = schema.struct_type(hints[field.name])
            if sub is not None:
                walk(sub)
            if not schema.description(field) and cls is not RunConfig:
                missing.append(f"{cls.__name__}.{field.name}")

    walk(RunConfig)
    walk(RoleEntry)
    assert missing == []


def test_max_rollout_replicas_limits_nothing_while_the_online_planner_is_off():
    assert load_config_text("[rollout]\nnum_replicas = 8").rollout.num_replicas == 8
