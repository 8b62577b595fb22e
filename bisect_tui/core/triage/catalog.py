"""Where the core gets an engine from, without knowing which engines exist.

The CLI and the app choose engines (through the registry) and hand the core a
catalog: how to load an engine by name, and its declared options (for the
command line a report shows). A `Triage` given an engine object, or a factory,
uses that; one given neither asks the installed catalog. The core never
imports an engine package.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence


@dataclass(frozen=True)
class EngineCatalog:
    # name -> a fresh engine object; a module-level function, so a partial of it is
    # picklable and pool workers can load their own engine
    load: Callable[[str], Any]
    # name -> the engine's declared options (EngineOption), read without loading its library
    options: Callable[[str], Sequence[Any]]
    # the unfused FP32 reference the baseline runs on (api.reference.UnfusedReference)
    reference: Callable[[], Any]


_installed: Optional[EngineCatalog] = None


def install(catalog: EngineCatalog) -> None:
    global _installed
    _installed = catalog


def installed() -> EngineCatalog:
    if _installed is None:
        raise RuntimeError("no engine catalog: the caller gives Triage an engine or an engine factory, "
                           "or installs a catalog first (bisect_tui.engine_choice.install_registry())")
    return _installed


def factory(name: str) -> Callable[[], Any]:
    """A picklable zero-argument callable that loads engine `name` from the installed catalog."""
    return functools.partial(installed().load, name)
