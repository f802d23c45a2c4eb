"""Text <-> token ids for a checkpoint folder (tokenizer.json), plus chat templates.

Uses the `tokenizers` library directly: Hugging Face `transformers` is never imported at
serve time.
"""
from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, checkpoint: Path):
        checkpoint = Path(checkpoint)
        self.checkpoint = checkpoint
        path = checkpoint / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint folder {checkpoint} has no tokenizer.json")
        self._tok = Tokenizer.from_file(str(path))
        # A tokenizer.json may carry training-time truncation/padding; we bound lengths
        # ourselves and never pad (batches are packed).
        self._tok.no_truncation()
        self._tok.no_padding()
        cfg_path = checkpoint / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template: str | None = _chat_template(checkpoint, self.config)

    @property
    def backend(self):
        """The tokenizers.Tokenizer itself (what a grammar engine reads the vocabulary from)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def pair_lengths(self, first: str, seconds: list[str]) -> list[int]:
        """Tokens of each (first, second) pair as the checkpoint's post-processor joins them (a
        cross-encoder's input: `[CLS] query [SEP] text [SEP]` for BERT), untruncated."""
        return [len(e.ids) for e in self._tok.encode_batch([(first, second) for second in seconds])]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, user_text: str) -> str:
        """Render one user turn with the checkpoint's chat template, ready for the reply. The
        template writes the special tokens it wants (a BOS, say): encode the result with
        `add_special_tokens=False`, as Hugging Face's tokenizing apply_chat_template does."""
        return self.render_chat([{"role": "user", "content": user_text}])

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True) -> str:
        """Render a whole conversation (`{"role", "content"}` dicts, as OpenAI's chat API sends
        them; tool calls and answers as Hugging Face's templates take them) with the chat
        template, ready for the assistant's reply; encode it as above. `tools`: OpenAI's tool
        definitions, the template's `tools` variable (None: not defined, as HF leaves it)."""
        if not self.chat_template:
            raise ValueError("this checkpoint has no chat template; send apply_chat_template=false")
        extra = {"tools": tools} if tools else {}
        return _render_chat_template(
            self.chat_template,
            **extra,
            add_generation_prompt=add_generation_prompt,
            messages=messages,
            bos_token=_token_str(self.config.get("bos_token")),
            eos_token=_token_str(self.config.get("eos_token")),
        )


def _chat_template(checkpoint: Path, config: dict) -> str | None:
    """The checkpoint's chat template: `chat_template.jinja` (transformers >= 4.43 saves it
    there), else tokenizer_config.json's `chat_template`, a string or a list of named templates
    of which "default" is the one for plain chat."""
    path = checkpoint / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return template


def _token_str(tok) -> str:
    if isinstance(tok, dict):  # {"content": "<s>", ...} in some tokenizer_config files
        return tok.get("content", "")
    return tok or ""


def _render_chat_template(template: str, **context) -> str:
    # Chat templates are Jinja; render them sandboxed, as they come with the checkpoint.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
    return env.from_string(template).render(**{"add_generation_prompt": True, **context})
