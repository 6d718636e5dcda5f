"""`specgate` command line.

Each package owns its sub-commands in its own `cli.py` (`register(app)`), so
that this module stays a table of contents and importing the CLI does not
import every dependency of every component.
"""

from __future__ import annotations

import importlib
from typing import Optional

import typer

from . import __version__

app = typer.Typer(
    name="specgate",
    help="OpenAI-compatible gateway and speculation controller for vLLM + DSpark.",
    no_args_is_help=True,
    add_completion=False,
)

# Modules that contribute commands; each exposes `register(app: typer.Typer)`.
_COMMAND_MODULES = (
    "specgate.gateway_cli",
    "controller.cli",
    "drafters.cli",
    "specgate.stack_cli",
    "specgate.config_doc",
)


def _print_version(value: bool) -> None:
    if value:  # `specgate.__version__`: the installed package's metadata, so it cannot drift from pip's
        typer.echo(f"specgate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Optional[bool] = typer.Option(
        None, "--version", "-V", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """OpenAI-compatible gateway and speculation controller for vLLM + DSpark."""


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # component not built yet; its commands are absent
                continue
            raise
        module.register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
