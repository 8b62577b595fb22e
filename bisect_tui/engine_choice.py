"""The one place outside the registry where engines are chosen: the CLI and the
app install the registry as the core's engine catalog and build the engine
factories their triages get."""

from __future__ import annotations

import functools
from typing import Any, Callable


def _options(name: str):
    from bisect_tui.engines.registry import declaration

    return tuple(declaration(name).OPTIONS)


def install_registry() -> None:
    """Make the registry's engines the ones a triage without an injected engine loads."""
    from bisect_tui.core.triage.catalog import EngineCatalog, install
    from bisect_tui.engines.registry import default_reference, get_engine

    install(EngineCatalog(load=get_engine, options=_options, reference=default_reference))


def engine_factory(name: str) -> Callable[[], Any]:
    """A picklable factory for pool workers: loads engine `name` from the registry."""
    from bisect_tui.engines.registry import get_engine

    return functools.partial(get_engine, name)
