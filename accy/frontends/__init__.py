"""Sources of semantic modules other than choir text.

:mod:`accy.frontends.onnx` imports an ONNX ``ModelProto`` (or ``.onnx`` file)
onto today's ``semantic`` ops; it needs the optional ``onnx`` package
(``pip install 'accy[onnx]'``) and is imported lazily, so ``import accy``
never imports ``onnx``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accy.preparation.products import SemanticModule


def load_model_file(path: str, **kwargs: Any) -> SemanticModule:
    """The verified semantic module of a front-end file (today: ``*.onnx``)."""
    from accy.frontends.onnx import import_onnx

    return import_onnx(path, **kwargs)


def load_program(path: str, shapes: Mapping[int, Sequence[int]] | None = None) \
        -> SemanticModule:
    """The verified semantic module of any program file: choir text, or a model a
    front end reads (``*.onnx``). Every command that takes a program path reads it here.

    ``shapes`` (``{argument index: dims}``, as ``--shape`` and sweeps give them)
    reaches a front end's import, so a model's shape computations fold for them;
    choir text binds shapes later, at the contract stage, and ignores it here.
    """
    if is_frontend_file(path):
        return load_model_file(path, argument_shapes=shapes or None)
    from accy.preparation.products import SemanticModule

    return SemanticModule.from_file(path)


def is_frontend_file(path: str) -> bool:
    """Whether ``path`` names a model a front end reads (by its suffix)."""
    return str(path).lower().endswith(".onnx")


__all__ = ["is_frontend_file", "load_model_file", "load_program"]
