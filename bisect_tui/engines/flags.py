"""Engine declarations -> CLI flags and back to an `EngineConfig`.

The common core (`--engine`, `--precision`, `--keep-fp32`) is shared; every
other flag comes from an engine's `OPTIONS`, so a new engine's settings appear
in `--help`, are validated and reach the session key without touching the CLI.
Only the declarations are imported here (no engine library)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from bisect_tui.core.errors import UserError
from bisect_tui.api import PRECISIONS, EngineConfig, EngineOption
from bisect_tui.engines.registry import canonical, declaration, engine_names


def _dest(opt: EngineOption) -> str:
    return opt.flag.lstrip("-").replace("-", "_")


def all_options() -> list[tuple[str, EngineOption]]:
    """(engine, option) for every registered engine, in registry order."""
    return [(name, opt) for name in engine_names() for opt in declaration(name).OPTIONS]


def add_engine_flags(group: argparse._ArgumentGroup) -> None:
    names = engine_names()
    labels = ", ".join(f"{n} = {declaration(n).LABEL}" for n in names)
    group.add_argument("--engine", default="ort", metavar="ENGINE",
                       help=f"fused engine: {labels} (default ort)")
    precisions = list(dict.fromkeys([*PRECISIONS, *(p for n in names
                                                    for p in declaration(n).CAPABILITIES.precisions)]))
    group.add_argument("--precision", default="fp32", choices=precisions,
                       help="engine precision (default fp32; each engine says which it runs)")
    seen: set[str] = set()
    for engine, opt in all_options():
        if opt.flag in seen:
            continue
        seen.add(opt.flag)
        help_text = f"[{engine}] {opt.help}"
        if opt.kind == "choice":
            group.add_argument(opt.flag, dest=_dest(opt), default=opt.default, choices=list(opt.choices),
                               help=help_text)
        elif opt.kind in ("list", "mapping"):
            group.add_argument(opt.flag, dest=_dest(opt), action="append", default=[],
                               metavar=opt.metavar or opt.name.upper(), help=help_text)
        else:
            group.add_argument(opt.flag, dest=_dest(opt), default=None, metavar=opt.metavar or opt.name.upper(),
                               help=help_text + (f" (default {opt.default})" if opt.default else ""))
    group.add_argument("--keep-fp32", action="append", default=[], metavar="NODE",
                       help="with --precision fp16: keep this original node in FP32 (a keep-set that "
                            "`bisect` finds for you)")


def _kv_list(items: Sequence[str], flag: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        if "=" not in item:
            raise UserError(f"bad {flag} {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out.append((k.strip(), v.strip()))
    return tuple(sorted(out))


def _given(opt: EngineOption, value: Any) -> bool:
    if opt.kind in ("list", "mapping"):
        return bool(value)
    if opt.kind == "choice":
        return value is not None and value != opt.default
    return value is not None


def option_fields(decl, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Raw option values (by option name: strings, lists, KEY=VALUE lists) ->
    `EngineConfig` fields and engine-specific `options`; what the CLI and the
    settings form share. Options absent from `values` are left out."""
    fields: dict[str, Any] = {}
    options: dict[str, str] = {}
    for opt in decl.OPTIONS:
        if opt.name not in values:
            continue
        value = values[opt.name]
        if opt.kind == "mapping":
            value = _kv_list(value or [], opt.flag)
        elif opt.kind == "list":
            value = tuple(dict.fromkeys(value or []))
        if opt.field.startswith("options."):
            if _given(opt, value):
                options[opt.field[len("options."):]] = (json.dumps(sorted(set(value))) if opt.kind == "list"
                                                        else str(value))
            continue
        if opt.field == "providers":
            if value:
                fields["providers"] = decl.load().providers_for(value)
            continue
        if value is not None:
            fields[opt.field] = value
    return fields, options


def config_from_args(args: argparse.Namespace) -> tuple[str, EngineConfig]:
    """The engine's name and config from parsed flags; a flag of another
    engine is refused (it would be ignored), then the engine validates."""
    engine = canonical(args.engine)
    decl = declaration(engine)
    own = {o.flag for o in decl.OPTIONS}
    for other, opt in all_options():
        if opt.flag not in own and _given(opt, getattr(args, _dest(opt), None)):
            raise UserError(f"{opt.flag} is an option of {declaration(other).LABEL} (--engine {other}); "
                            f"this run uses --engine {engine} ({decl.LABEL}), which would ignore it")
    values = {opt.name: getattr(args, _dest(opt), None) for opt in decl.OPTIONS}
    fields, options = option_fields(decl, values)
    fields.update(precision=args.precision, keep_fp32=tuple(sorted(set(getattr(args, "keep_fp32", []) or []))))
    config = EngineConfig(**fields, options=tuple(sorted(options.items())))
    decl.load().validate(config)
    return engine, config
