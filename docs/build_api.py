"""Build the API reference with pdoc (``make docs``); the arguments are pdoc's.

The package and ``integrations.nemo_rl`` load their public names on first use (a module
``__getattr__``, so that importing them stays cheap); pdoc looks for the names of ``__all__`` in
the module's ``__dict__`` only and would leave them off the page. They are resolved here first.
"""

from __future__ import annotations

import importlib
import sys

LAZY_PACKAGES = ("rl_gym_actors", "rl_gym_actors.integrations.nemo_rl")


def resolve_lazy_names(package: str) -> None:
    """Put each name of ``package.__all__`` into the module's namespace (loading it)."""
    module = importlib.import_module(package)
    for name in module.__all__:
        if name not in vars(module):
            setattr(module, name, getattr(module, name))


def main(argv: list[str]) -> None:
    for package in LAZY_PACKAGES:
        resolve_lazy_names(package)
    from pdoc.__main__ import cli

    cli(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
