"""A prompt file made callable: Jinja2 templates in, chat messages out.

Few-shot examples become user/assistant turns placed before the final user turn. The
user side of an example goes through the same `user` template as the real call, and
the assistant side is `json.dumps` of YAML data, so an example can never be malformed
JSON or drift from the live format.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta

from rexeval.prompts.errors import PromptError
from rexeval.prompts.untrusted import close_tag, delimit_untrusted, open_tag

REQUIRED_KEYS = ("name", "version", "description", "system", "user", "output")
OPTIONAL_KEYS = ("examples", "examples_from", "defaults")


def _as_json(value: Any) -> str:
    """Strings pass through (already JSON); anything else is dumped on one line."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _make_env() -> jinja2.Environment:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        autoescape=False, keep_trailing_newline=False,
    )
    env.filters["untrusted"] = delimit_untrusted
    env.filters["as_json"] = _as_json
    env.globals.update(open_tag=open_tag, close_tag=close_tag)
    return env


ENV = _make_env()


class PromptTemplate:
    """One prompt file: its identity (name, version), its templates and its examples."""

    def __init__(self, path: Path, raw: bytes, data: Any):
        self.path = Path(path)
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self._data = _check_keys(self.path, data)
        self.name: str = data["name"]
        self.declared_version: int = data["version"]
        self.version = f"{self.name}/v{self.declared_version}-{self.sha256[:8]}"
        self.description: str = data["description"]
        self.output: str = data["output"]
        self.defaults: dict[str, Any] = dict(data.get("defaults") or {})
        self.examples_from: str | None = data.get("examples_from")
        self._compile()

    # Compiled Jinja templates do not pickle: rebuild them after Ray ships us to a worker.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_system", "_user")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compile()

    def __repr__(self) -> str:
        return f"PromptTemplate({self.version!r}, path={str(self.path)!r})"

    @property
    def variables(self) -> frozenset[str]:
        """Names the templates read; render() accepts exactly these (defaults may be omitted)."""
        return self._variables

    def version_for(self, domain: Any = None) -> str:
        """The version, extended with the domain file's hash when a domain is rendered in."""
        if domain is None:
            return self.version
        return f"{self.version}+{domain.domain}-{domain.digest[:8]}"

    def render(self, **variables: Any) -> list[dict[str, str]]:
        """System turn, few-shot user/assistant pairs, then the final user turn."""
        unknown = set(variables) - self._variables
        if unknown:
            raise PromptError(
                f"{self.name}: unknown variable(s) {sorted(unknown)}; "
                f"it takes {sorted(self._variables)} ({self.path})")
        missing = self._variables - set(variables) - set(self.defaults)
        if missing:
            raise PromptError(f"{self.name}: missing variable(s) {sorted(missing)} ({self.path})")
        values = {**self.defaults, **variables}
        pairs = self._example_pairs(values)
        messages = [{"role": "system", "content": self._render(self._system, values)}]
        for user_vars, output in pairs:
            messages.append({"role": "user", "content": self._render(self._user, user_vars)})
            messages.append({"role": "assistant",
                             "content": json.dumps(output, ensure_ascii=False)})
        messages.append({"role": "user", "content": self._render(self._user, values)})
        return messages

    def _example_pairs(self, values: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
        if self.examples_from == "domain":
            domain = values.get("domain")
            if not (hasattr(domain, "examples") and hasattr(domain, "topics")):
                raise PromptError(f"{self.name}: `domain` must be a Domain "
                                  f"(see load_domain), got {type(domain).__name__}")
            return [({**values, "review": ex["review"]}, ex["triplets"])
                    for ex in domain.examples]
        return [({**self.defaults, **ex["vars"]}, ex["output"])
                for ex in self._data.get("examples") or []]

    def _render(self, template: jinja2.Template, values: dict[str, Any]) -> str:
        try:
            return template.render(**values).strip()
        except PromptError as exc:
            raise PromptError(f"{self.name}: {exc} ({self.path})") from exc
        except (jinja2.TemplateError, TypeError, AttributeError) as exc:
            raise PromptError(f"{self.name}: cannot render: {exc} ({self.path})") from exc

    def _compile(self) -> None:
        names: set[str] = set()
        for part in ("system", "user"):
            source = self._data[part]
            try:
                names |= meta.find_undeclared_variables(ENV.parse(source))
                setattr(self, f"_{part}", ENV.from_string(source))
            except jinja2.TemplateSyntaxError as exc:
                raise PromptError(
                    f"{self.path}: Jinja syntax error in `{part}` line {exc.lineno}: "
                    f"{exc.message}") from exc
        self._variables = frozenset(names - set(ENV.globals))
        self._check_extras()

    def _check_extras(self) -> None:
        bad = set(self.defaults) - self._variables
        if bad:
            raise PromptError(f"{self.path}: defaults for unused variable(s) {sorted(bad)}")
        if self.examples_from not in (None, "domain"):
            raise PromptError(f"{self.path}: examples_from must be 'domain' when set")
        if self.examples_from and "domain" not in self._variables:
            raise PromptError(f"{self.path}: examples_from 'domain' but no `domain` variable")
        examples = self._data.get("examples") or []
        if not isinstance(examples, list):
            raise PromptError(f"{self.path}: `examples` must be a list")
        for i, ex in enumerate(examples):
            if not (isinstance(ex, dict) and set(ex) == {"vars", "output"}
                    and isinstance(ex["vars"], dict)):
                raise PromptError(f"{self.path}: example {i} needs exactly `vars` (a mapping) "
                                  f"and `output`")
            extra = set(ex["vars"]) - self._variables
            if extra:
                raise PromptError(f"{self.path}: example {i} sets unknown variable(s) "
                                  f"{sorted(extra)}")
            self._render(self._user, {**self.defaults, **ex["vars"]})  # fail at load, not later


def _check_keys(path: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise PromptError(f"{path}: a prompt file must be a YAML mapping")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    unknown = sorted(set(data) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if missing or unknown:
        raise PromptError(f"{path}: missing key(s) {missing}, unknown key(s) {unknown}")
    if data["name"] != path.stem:
        raise PromptError(f"{path}: name {data['name']!r} differs from the file name")
    version = data["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PromptError(f"{path}: version must be an integer >= 1, got {version!r}")
    for key in ("description", "system", "user", "output"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise PromptError(f"{path}: `{key}` must be a non-empty string")
    if not isinstance(data.get("defaults") or {}, dict):
        raise PromptError(f"{path}: `defaults` must be a mapping")
    return data
