"""``transformers serve``, fused: ``python -m flashsampling_inductor.serve [ARGS]``.

transformers' server loads its models itself (``ModelManager._load_model``, on the first
request naming a model or at start-up for ``force_model``), so its users never hold the model
to call ``hf.enable`` on. This entry point wraps that loader: every model the server loads is
enabled before the server makes its ``generate`` calls or, with ``--continuous-batching``, its
continuous-batching manager; then it runs transformers' own CLI as ``transformers serve
ARGS``. The options are transformers' (``--help`` prints them). Models whose class has no
``generate`` (a decision head) are served as transformers serves them.

In a program that builds the server itself, ``install()`` does the same before the server's
first load.
"""

from __future__ import annotations

import functools
import sys

from . import hf

__all__ = ["install", "main"]


def install() -> None:
    """Every model that transformers' ``ModelManager`` loads from now on is ``hf.enable``d
    (idempotent)."""
    from transformers.cli.serving.model_manager import ModelManager

    load = ModelManager._load_model
    if getattr(load, "_enables_flashsampling", False):
        return

    @functools.wraps(load)
    def load_enabled(self, *args, **kwargs):
        model = load(self, *args, **kwargs)
        if hasattr(model, "generate"):
            hf.enable(model)
        return model

    load_enabled._enables_flashsampling = True
    ModelManager._load_model = load_enabled


def main(argv: list[str] | None = None) -> None:
    """``transformers serve`` with ``argv`` (default: this process's arguments), fused."""
    import typer
    from transformers.cli.serve import Serve

    install()
    app = typer.Typer(add_completion=False)
    app.command()(Serve)  # the one command: its options are the arguments
    args = sys.argv[1:] if argv is None else argv
    app(args=args, prog_name="python -m flashsampling_inductor.serve")


if __name__ == "__main__":
    main()
