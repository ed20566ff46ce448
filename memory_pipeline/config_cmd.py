"""`memory config show` and `memory config set KEY VALUE`.

``show`` prints every setting as the pipeline sees it (defaults included, paths resolved)
as YAML or JSON. A path written with ``$VARIABLES`` is shown as written: what the
environment holds is not the file's to print.

``set`` changes one setting in the file: the value is read as YAML (``256``, ``true``,
``[image, pdf]``, ``null``), the whole file is validated with the change by the same model
as every command uses, and only then written, by one rename. Where the setting is
already in the file (or its section is), only that text changes, so comments and layout stay;
otherwise the file is written out again with its keys in their order and its header comment.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from memory_pipeline.errors import ConfigError
from memory_pipeline.settings import (
    _looks_like_secret,
    _shown,
    load_settings,
    parse_yaml,
    read_config_text,
    resolve_config_path,
    settings_as_dict,
    settings_from_dict,
)

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*)*")
_NEW_FILE_HEADER = '# memory_pipeline configuration (see README "Configuration").\n# Relative paths are resolved against this file\'s folder.\n'
_NOT_SHOWN = "<value not shown>"


class SettingRefused(ConfigError):
    """`memory config set` was given a key or value that cannot be set (a usage error: exit 2)."""


Part = str | int


def parse_key(key: str) -> list[Part]:
    """``remote.providers.openai.base_url`` / ``sources[0].path`` as a list of names and indexes."""
    if not _KEY_RE.fullmatch(key):
        raise SettingRefused(f"{_shown(key)} is not a setting name (e.g. chunking.tokens, sources[0].path)", key=key)
    return [int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"\[\d+\]|[^.\[\]]+", key)]


# --- show --------------------------------------------------------------------------------


def show(config: str | None, key: str | None = None, *, as_json: bool = False) -> str:
    """The effective settings (or the one under ``key``) as YAML, or JSON with ``as_json``."""
    cfg_path = resolve_config_path(config)
    settings = load_settings(cfg_path)
    data: Any = settings_as_dict(settings)
    if isinstance(settings.data_dir, str):  # object storage: the local folder actually used, default or not
        from memory_pipeline import storage

        data["local_dir"] = str(storage.of(settings).root)
    else:
        data.pop("local_dir", None)  # only meaningful with an s3:// data_dir
    raw = parse_yaml(read_config_text(cfg_path), str(cfg_path)) or {}
    _paths_as_written(data, raw)
    data = _masked(data)
    if key is not None:
        data = _lookup(data, parse_key(key), key)
    if as_json:
        return json.dumps(data, indent=2, ensure_ascii=False)
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)
    if key is not None:  # one setting: just its value, for scripts
        return body.removesuffix("...\n").rstrip("\n")
    return f"# effective configuration of {cfg_path} (defaults included)\n{body.rstrip(chr(10))}"


def _paths_as_written(data: dict, raw: dict) -> None:
    """Paths whose text uses environment variables: as written, not expanded."""
    for key in ("data_dir", "local_dir"):
        if isinstance(raw.get(key), str) and "$" in raw[key]:
            data[key] = raw[key]
    raw_sources = raw.get("sources")
    for i, src in enumerate(data.get("sources", [])):
        item = raw_sources[i] if isinstance(raw_sources, list) and i < len(raw_sources) else None
        if isinstance(item, dict) and isinstance(item.get("path"), str) and "$" in item["path"]:
            src["path"] = item["path"]


def _masked(value: Any) -> Any:
    # The loader refuses secrets, so none should be here; this keeps it so whatever changes upstream.
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return _NOT_SHOWN if isinstance(value, str) and _looks_like_secret(value) else value


def _lookup(data: Any, parts: list[Part], key: str) -> Any:
    for part in parts:
        ok = isinstance(part, int) and isinstance(data, list) and part < len(data)
        ok = ok or (isinstance(part, str) and isinstance(data, dict) and part in data)
        if not ok:
            raise SettingRefused(f"no setting {_shown(key)}", key=key)
        data = data[part]  # type: ignore[index]
    return data


# --- set ---------------------------------------------------------------------------------


def set_value(config: str | None, key: str, value_text: str) -> tuple[Path, Any]:
    """Set ``key`` to the YAML value ``value_text`` in the config file (created if missing)."""
    cfg_path = resolve_config_path(config)
    where = str(cfg_path)
    parts = parse_key(key)
    try:
        value = parse_yaml(value_text, "the value")
    except ConfigError as err:
        raise SettingRefused(f"{key}: {err}", key=key) from err
    exists = cfg_path.is_file()
    if not exists and not cfg_path.parent.is_dir():
        raise ConfigError(f"{cfg_path.parent}: no such folder for the config file", path=where)
    text = read_config_text(cfg_path) if exists else ""
    raw = parse_yaml(text, where) if text.strip() else None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a mapping", path=where)
    changed = copy.deepcopy(raw)
    _assign(changed, parts, value, key)
    try:
        settings_from_dict(changed, base_dir=cfg_path.parent, config_path=cfg_path)
    except ConfigError as err:
        raise SettingRefused(str(err), key=err.key, path=err.path, hint=err.hint) from err
    new_text = _edited(text, parts, value, changed, where)
    if len(new_text.encode("utf-8")) > 1024 * 1024:
        raise SettingRefused(f"{where}: the file would be larger than 1 MiB", key=key, path=where)
    _write_atomically(cfg_path, new_text)
    return cfg_path, value


def _assign(raw: dict, parts: list[Part], value: Any, key: str) -> None:
    node: Any = raw
    for i, part in enumerate(parts):
        here = _render(parts[: i + 1])
        last = i == len(parts) - 1
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                size = f"has {len(node)} item(s)" if isinstance(node, list) else "is not a list"
                raise SettingRefused(f"{here} does not exist ({_render(parts[:i])} {size})", key=key)
        elif not isinstance(node, dict):
            raise SettingRefused(f"{_render(parts[:i])} is not a mapping, so it has no {part!r}", key=key)
        elif not last and node.get(part) is None:  # a missing (or empty) section is created
            node[part] = {}
        container: Any = node  # a list (int part) or a dict (str part), as checked above
        if last:
            container[part] = value
        else:
            node = container[part]


def _render(parts: list[Part]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _edited(text: str, parts: list[Part], value: Any, expected: dict, where: str) -> str:
    """``text`` with the change made in place when that gives exactly ``expected``, else re-written."""
    if text.strip():
        attempt = _edit_in_place(text, parts, value, parse_yaml(text, where, compose=True))
        if attempt is not None:
            try:
                if parse_yaml(attempt, where) == expected:
                    return attempt
            except ConfigError:
                pass
        print(f"[WARN] {where}: comments inside the file could not be kept; its keys and their order are", file=sys.stderr)
    header = "".join(re.match(r"(?:[ \t]*#[^\n]*\n)*", text).group(0)) if text.strip() else _NEW_FILE_HEADER  # type: ignore[union-attr]
    return header + yaml.safe_dump(expected, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 30).removesuffix("\n...\n").strip()


def _edit_in_place(text: str, parts: list[Part], value: Any, root: Any) -> str | None:
    node, depth, key = root, 0, None
    for part in parts:
        if isinstance(part, int) and isinstance(node, yaml.SequenceNode) and part < len(node.value):
            node, key = node.value[part], None
        elif isinstance(part, str) and isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if not match:
                break
            key, node = match[0]
        else:
            return None
        depth += 1
    if depth == len(parts):  # the setting is in the file: replace its value's text
        if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False):
            start, end = node.start_mark.index, node.end_mark.index
            if start == end:  # `key:` with nothing after it
                return None
            return text[:start] + _flow(value) + text[end:]
        if node.value:
            # A whole block section (``query: {}``, ``sources: [...]``): its text, from its key's
            # colon (an item's first key in a list) to the end of its last value, becomes the value
            # in flow style on that line. Its own comments go with the values they described; every
            # other line stays (the file was written out again, losing every comment, the shipped
            # file's commented-out help included).
            start = text.index(":", key.end_mark.index) + 1 if key is not None else node.start_mark.index
            return text[:start] + (" " if key is not None else "") + _flow(value) + text[_last_value_end(node, text) :]
        return None
    # Add the missing keys under the deepest block mapping that exists.
    if not isinstance(node, yaml.MappingNode) or node.flow_style or not node.value:
        return None
    rest = parts[depth:]
    if not all(isinstance(p, str) for p in rest):
        return None
    indent = node.value[0][0].start_mark.column
    lines = [" " * (indent + 2 * i) + f"{p}:" for i, p in enumerate(rest[:-1])]
    lines.append(" " * (indent + 2 * (len(rest) - 1)) + f"{rest[-1]}: {_flow(value)}")
    last_end = node.value[-1][1].end_mark.index
    cut = text.find("\n", max(last_end - 1, 0))
    cut = len(text) if cut < 0 else cut + 1
    head = text[:cut] if text[:cut].endswith("\n") else text[:cut] + "\n"
    return head + "\n".join(lines) + "\n" + text[cut:]


def _last_value_end(node: Any, text: str) -> int:
    """Where the last value of a block collection ends: its last scalar or flow value's end, not
    the collection's own end mark (which is the next key's start, comments and blank lines between),
    and before the line breaks a block scalar (``|``, ``>``) takes as its own."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style and node.value:
        node = node.value[-1][1] if isinstance(node, yaml.MappingNode) else node.value[-1]
    end = node.end_mark.index
    while end > node.start_mark.index and text[end - 1] == "\n":
        end -= 1
    return end


def _write_atomically(path: Path, text: str) -> None:
    """Write beside the file, then one rename: a reader sees the old file or the new, never half of one."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- the command -------------------------------------------------------------------------


def run(args: Any) -> int:
    """`memory config show|set`; SettingRefused for a key or value that cannot be set."""
    if args.action == "show":
        sys.stdout.write(show(args.config, args.key, as_json=args.json) + "\n")
        return 0
    path, value = set_value(args.config, args.key, args.value)
    print(f"{args.key}: {_flow(value)}  ({path})")
    return 0
