"""A model's tokenizer without transformers: text <-> ids, the special tokens, the chat template.

A role that only tokenizes (the prompt loader, the reward role, evaluation's prompts)
loads this instead of transformers' ``AutoTokenizer``, which imports transformers and
torch with it: about 2.5 CPU-seconds per process start, for a tokenizer that loads in
10 ms. ``load_tokenizer(model_dir)`` reads, as transformers does:

- ``tokenizer.json``: the ``tokenizers`` pipeline (normalizer, pre-tokenizer, model,
  decoder, post-processor, added tokens), run by the ``tokenizers`` library as written;
- ``tokenizer_config.json``: the named special tokens (``bos_token``, ``eos_token``,
  ``pad_token``, ...), the extra ones, ``added_tokens_decoder``, ``add_bos_token`` /
  ``add_eos_token``, ``split_special_tokens``, ``chat_template``;
- ``special_tokens_map.json``: the named special tokens of an older save (one whose
  ``tokenizer_config.json`` has no ``added_tokens_decoder``);
- ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``: the chat
  templates, before ``tokenizer_config.json``'s.

``LightTokenizer`` offers the part of the Hugging Face tokenizer API asyncflow calls,
with its signatures and results: ``tok(text, add_special_tokens=...)["input_ids"]``,
``encode``, ``decode(ids, skip_special_tokens=...)``, ``batch_decode``, ``apply_chat_template(messages,
add_generation_prompt=..., tokenize=...)``, ``chat_template``, ``bos/eos/pad/unk_token``
and their ``_id``, ``special_tokens_map``, ``all_special_ids``, ``len()``. Chat templates
are rendered as transformers renders them (``utils/chat_template_utils.py``): jinja2's
immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, the loop controls, the
``{% generation %}`` tag, ``raise_exception``, a ``tojson`` that escapes no HTML and keeps
non-ASCII text, ``strftime_now``, ``dict`` and a ``namespace`` that refuses
underscore-prefixed names; the special tokens are template variables.

Invariant (tests/engines/test_tokenizer.py, against ``AutoTokenizer``): the same ids,
text, special token ids and chat renders, on the tiny model's tokenizers and SmolLM2's.

transformers' own tokenizer is returned instead where this one would not match it:
a directory without ``tokenizer.json`` (a slow-only tokenizer: ``vocab.json`` and
``merges.txt``, a SentencePiece model), and a tokenizer whose decoded text transformers
rewrites (``clean_up_tokenization_spaces`` on a model other than BPE).
Limit: transformers 5 rebuilds the pipeline of some tokenizer classes (``Qwen2Tokenizer``,
``LlamaTokenizer``, ...) from the vocabulary instead of running ``tokenizer.json`` as
written. For a checkpoint's own ``tokenizer.json`` the two agree, and a ``tokenizer.json``
that transformers saved is its rebuilt pipeline (``toy/tiny.py`` saves the tiny
tokenizer so); one written by other means (the ``tokenizers`` library alone) may differ
from it on text its vocabulary cannot spell. transformers' regex patch of Mistral
tokenizers (``fix_mistral_regex``) is not applied here either.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, processors

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens, in transformers' order (``SPECIAL_TOKENS_ATTRIBUTES``)."""


def load_tokenizer(model_dir: str | Path) -> Any:
    """The tokenizer saved in ``model_dir``: a ``LightTokenizer``, or transformers'
    ``AutoTokenizer`` where this one would not match it (see the module docstring)."""
    path = Path(model_dir)
    if not (path / "tokenizer.json").is_file():
        if not (path / "tokenizer_config.json").is_file():
            raise FileNotFoundError(
                f"{path} has no tokenizer (neither tokenizer.json nor tokenizer_config.json): save the model's "
                "tokenizer beside it (tokenizer.save_pretrained(model_dir))"
            )
        return _transformers_tokenizer(path)  # slow-only: the vocabulary files need transformers' converters
    config = _read_json(path / "tokenizer_config.json")
    backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    if config.get("clean_up_tokenization_spaces") and (
        type(backend.model).__name__ != "BPE"
        or config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")
    ):
        return _transformers_tokenizer(path)  # transformers rewrites the decoded text
    return LightTokenizer(backend, config, _read_json(path / "special_tokens_map.json"), _chat_templates(path, config))


def _transformers_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _content(token: Any) -> str:
    """A token as a config writes it: a string, or a serialized AddedToken."""
    return token["content"] if isinstance(token, Mapping) else str(token)


def _chat_templates(path: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """The template, or the named templates (``default``, ``tool_use``, ...)."""
    named = {}
    if (path / "chat_template.jinja").is_file():
        named["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        named.update({f.stem: f.read_text(encoding="utf-8") for f in sorted(extra.glob("*.jinja"))})
    if not named:
        template = config.get("chat_template")
        if not isinstance(template, list):
            return template
        named = {t["name"]: t["template"] for t in template}
    return named["default"] if list(named) == ["default"] else named


class LightTokenizer:
    """A ``tokenizers`` pipeline with the special tokens and chat template of its
    ``tokenizer_config.json``: the Hugging Face tokenizer API asyncflow uses."""

    def __init__(
        self,
        backend: Tokenizer,
        config: Mapping[str, Any],
        special_tokens_map: Mapping[str, Any],
        chat_template: str | dict[str, str] | None,
    ):
        """``config``: tokenizer_config.json; ``special_tokens_map``: special_tokens_map.json
        (used only when the config has no ``added_tokens_decoder``, as transformers does)."""
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        named = {k: config[k] for k in SPECIAL_TOKEN_NAMES if config.get(k) is not None}
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
        if "added_tokens_decoder" not in config:  # an older save: the map file has the last word
            named.update({k: v for k, v in special_tokens_map.items() if k in SPECIAL_TOKEN_NAMES and v is not None})
            extra = [*extra, *(t for t in special_tokens_map.get("additional_special_tokens", []) if t not in extra)]
        self.special_tokens_map: dict[str, str] = {k: _content(named[k]) for k in SPECIAL_TOKEN_NAMES if k in named}
        """The named special tokens: the template's variables (``bos_token``, ``eos_token``, ...)."""
        extra_tokens = [_content(t) for t in (extra.values() if isinstance(extra, Mapping) else extra)]
        # tokens the config adds or names that the pipeline lacks are added, special, as transformers does
        known = {t.content for t in backend.get_added_tokens_decoder().values()}
        added = [AddedToken(**{k: v for k, v in t.items() if k != "__type"}) for _, t in sorted(_decoder_items(config))]
        wanted = [*(t for t in added if t.content not in known)]
        wanted += [AddedToken(t, special=True) for t in [*self.special_tokens_map.values(), *extra_tokens]]
        missing, seen = [], set(known)
        for token in wanted:
            if token.content not in seen:
                seen.add(token.content)
                missing.append(token)
        if missing:
            backend.add_tokens(missing)
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        if "add_bos_token" in config or "add_eos_token" in config or backend.post_processor is None:
            self._set_post_processor(bool(config.get("add_bos_token")), bool(config.get("add_eos_token")))
        self.all_special_ids = [
            i
            for i in dict.fromkeys(self.token_id(t) for t in [*self.special_tokens_map.values(), *extra_tokens])
            if i is not None
        ]

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        """``<bos> $A <eos>`` as the config asks (transformers' ``update_post_processor``)."""
        bos, eos = self.bos_token, self.eos_token
        add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
        first = [f"{bos}:0"] if add_bos else []
        last = [f"{eos}:0"] if add_eos else []
        single = [*first, "$A:0", *last]
        pair = [*single, *([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])]
        specials = [(t, self.token_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
        self.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join(single), pair=" ".join(pair), special_tokens=specials
        )

    # -- tokens and ids ------------------------------------------------------------------

    def token_id(self, token: str | None) -> int | None:
        """The id of ``token`` (the unknown token's id when the vocabulary lacks it)."""
        if token is None:
            return None
        found = self.backend_tokenizer.token_to_id(token)
        return found if found is not None or token == self.unk_token else self.unk_token_id

    def __getattr__(self, name: str) -> Any:
        """``bos_token``, ``eos_token``, ... (None when the tokenizer has none) and their ``_id``."""
        named = self.__dict__.get("special_tokens_map", {})  # not yet set: while unpickled
        if name in SPECIAL_TOKEN_NAMES:
            return named.get(name)
        if name.endswith("_id") and name[:-3] in SPECIAL_TOKEN_NAMES:
            return self.token_id(named.get(name[:-3]))
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """``{"input_ids": ..., "attention_mask": ...}`` of one text."""
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (a sequence of ints, numpy's included, or one int)."""
        seq = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
        return self.backend_tokenizer.decode(seq, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    # -- the chat template ---------------------------------------------------------------

    def get_chat_template(self, chat_template: str | None = None, tools: Sequence[Any] | None = None) -> str:
        """The template to render: ``chat_template`` (a template, or the name of one of
        the tokenizer's), else the tokenizer's (its ``tool_use`` one when given tools)."""
        if isinstance(self.chat_template, dict):
            named = self.chat_template
            if chat_template is not None:
                return named.get(chat_template, chat_template)
            if tools is not None and "tool_use" in named:
                return named["tool_use"]
            if "default" not in named:
                raise ValueError(f"the tokenizer has several chat templates and no default: pass one of {sorted(named)}")
            return named["default"]
        if chat_template is not None:
            return chat_template
        if self.chat_template is None:
            raise ValueError("the tokenizer has no chat template (tokenizer.chat_template), and none was passed")
        return self.chat_template

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:
        """One conversation (messages as dicts) rendered with the chat template: its
        text (``tokenize=False``), its ids (``return_dict=False``), or ``{"input_ids",
        "attention_mask"}``. ``tools`` are JSON schemas; ``kwargs`` are template variables
        (over the special tokens)."""
        if not conversation:
            raise ValueError("cannot apply the chat template to an empty conversation: give at least one message")
        template = _compiled(self.get_chat_template(chat_template, tools))
        messages = [{k: v for k, v in m.items() if v is not None} for m in conversation]  # as transformers normalises them
        text = template.render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )
        if not tokenize:
            return text
        out = self(text, add_special_tokens=False)
        return out if return_dict else out["input_ids"]


def _decoder_items(config: Mapping[str, Any]) -> Iterable[tuple[int, dict[str, Any]]]:
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        yield int(index), token


# -- the template's environment, as transformers builds it ---------------------------------


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    """JSON as ``json.dumps`` writes it: no HTML escaping (jinja2's own filter escapes ``<>&'``)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` in a template, and no other attribute of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's ``namespace`` that refuses underscore-prefixed names (a way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja2's signature: ``namespace(self=...)`` works
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace (underscore-prefixed)")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's tokens for
    transformers' assistant mask; rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(), namespace=_Namespace)
    return env.from_string(template)


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` (a transformers tokenizer)
    spells: its vocabulary's longest entry (a byte-level entry has one character per byte,
    at least as many as it decodes to). A text of more than ``n`` times this many
    characters is more than ``n`` tokens: known without tokenising it (a cheap bound)."""
    return max((len(k) for k in tokenizer.get_vocab()), default=1) or 1
