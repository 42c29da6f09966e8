"""Sweep files: which program variants a batch recompiles.

A sweep file (YAML) names ``programs`` (paths relative to the file) and,
optionally, ``targets`` (default ``[host]``), ``shapes`` (one ``{argN: AxB}``
binding per value) and ``options`` (``STAGE.NAME: [values]``, one axis each).
The variants are programs × targets × shapes × every option axis, in that
nesting order. Everything is checked up front: a malformed sweep (bad YAML, a
tag the safe loader does not construct, text that is not UTF-8) raises
:class:`~accy.errors.SweepError` pointing at the file (and the line, where YAML
knows it) before any work starts, and the variants are counted before any is
built: more than ``max_variants`` (:data:`MAX_VARIANTS`) is an error saying how
many the file defines.

Example
-------
>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> _ = open(os.path.join(d, "softmax.mlir"), "w").write("")
>>> _ = open(os.path.join(d, "s.yaml"), "w").write('''
... programs: [softmax.mlir]
... shapes: [{arg0: 1024x1024}]
... options: {kernel.block_size: [128, 256]}
... ''')
>>> [v.id for v in load_sweep(os.path.join(d, "s.yaml"))]
['softmax[target=host,arg0=1024x1024,kernel.block_size=128]', \
'softmax[target=host,arg0=1024x1024,kernel.block_size=256]']
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from accy.choir.location import Location
from accy.errors import OptionError, SweepError
from accy.preparation.options import RunOptions, Target, parse_shapes

TOP_LEVEL = ("programs", "targets", "shapes", "options")

MAX_VARIANTS = 100_000
"""Default cap on the variants of one batch (``accy batch --max-variants``): a small
file can define millions, and the cap is checked before any is built."""


@dataclass(frozen=True)
class Variant:
    """One program compiled for one target, shape binding and option setting."""

    program: str
    """Path of the program file (resolved against the sweep file's folder)."""
    target: str = "host"
    """``host`` or ``cuda:sm_XX``."""
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Argument index → the dims bound to its ``?`` dims."""
    options: dict[str, Any] = field(default_factory=dict)
    """``STAGE.NAME`` → value, in the sweep's axis order."""

    @property
    def name(self) -> str:
        """The program's file stem."""
        return os.path.splitext(os.path.basename(self.program))[0]

    @functools.cached_property
    def id(self) -> str:
        """Stable, readable id: ``softmax[target=host,arg0=1024x1024,kernel.block_size=128]``
        (made once: a batch names each variant several times, and a variant, frozen, keeps
        its shapes and options)."""
        parts = [f"target={self.target}"]
        parts += [f"arg{i}={_shape_text(self.shapes[i])}" for i in sorted(self.shapes)]
        parts += [f"{k}={_value_text(v)}" for k, v in self.options.items()]
        return f"{self.name}[{','.join(parts)}]"

    def run_options(self) -> RunOptions:
        """The target and options as validated :class:`RunOptions`."""
        return RunOptions.parse(self.target, self.options)

    def shape_assignments(self) -> list[str]:
        """``["arg0=1024x1024", ...]``, as ``--shape`` takes them."""
        return [f"arg{i}={_shape_text(self.shapes[i])}" for i in sorted(self.shapes)]

    def __hash__(self) -> int:
        return hash((self.program, self.id))

    def __str__(self) -> str:
        return self.id


def _shape_text(dims: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in dims) if dims else "scalar"


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _Reader:
    """Turns YAML nodes into values, with errors that carry the node's line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, message: str, node: yaml.Node | None = None) -> SweepError:
        if node is not None and node.start_mark is not None:
            mark = node.start_mark
            return SweepError(message, Location(self.path, mark.line + 1, mark.column + 1))
        return SweepError(f"{self.path}: {message}")

    def parse(self, text: str) -> yaml.Node | None:
        loader = yaml.SafeLoader(text)
        try:
            return loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            what = e.problem or e.context or "malformed YAML"
            loc = Location(self.path, mark.line + 1, mark.column + 1) if mark else None
            raise SweepError(f"invalid YAML: {what}", loc) from None
        except yaml.YAMLError as e:
            raise SweepError(f"{self.path}: invalid YAML: {e}") from None
        finally:
            loader.dispose()

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{what} must be a mapping", node)
        seen: set[str] = set()
        out = []
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if not isinstance(key, str):
                raise self.error(f"{what}: keys must be strings, got {key!r}", key_node)
            if key in seen:
                raise self.error(f"{what}: duplicate key '{key}'", key_node)
            seen.add(key)
            out.append((key, key_node, value_node))
        return out

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(f"{what} must be a list", node)
        if not node.value:
            raise self.error(f"{what} must not be empty", node)
        return list(node.value)

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error("expected a single value, not a list or mapping", node)
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(node, deep=True)
        except yaml.YAMLError as e:  # a tag the safe loader does not construct
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise self.error(f"unsupported YAML value ({what}); a sweep holds plain "
                             f"strings, numbers and lists", node) from None
        finally:
            loader.dispose()


def load_sweep(path: str | os.PathLike[str], max_variants: int = MAX_VARIANTS) -> list[Variant]:
    """Every variant of one sweep file, duplicates removed, in nesting order.

    Raises
    ------
    SweepError
        The file is missing or malformed, or defines more than ``max_variants``
        variants (counted before any is built); the message starts with its path.
    """
    return _dedupe(list(iter_sweep(path, max_variants)), os.fspath(path))


def count_variants(path: str | os.PathLike[str]) -> int:
    """How many variants the sweep file defines (programs × targets × shapes × axes),
    duplicates included, without building them."""
    return _read_sweep(os.fspath(path)).count


def iter_sweep(path: str | os.PathLike[str], max_variants: int = MAX_VARIANTS) \
        -> Iterator[Variant]:
    """The variants of one sweep file, built one at a time (duplicates not removed).

    The file is read and checked, and its variants counted, before the first
    is yielded: more than ``max_variants`` is a :class:`SweepError` that says
    how many it defines.
    """
    sweep = _read_sweep(os.fspath(path))
    if sweep.count > max_variants:
        raise SweepError(f"{sweep.path}: the sweep defines {sweep.count} variants, more than "
                         f"the limit of {max_variants} (raise it with --max-variants)")
    return sweep.variants()


@dataclass
class _Sweep:
    """A checked sweep file: its axes, not yet multiplied out."""

    path: str
    programs: list[str]
    targets: list[Target]
    shapes: list[dict[int, tuple[int, ...]]]
    axes: list[tuple[str, list[Any]]]

    @property
    def count(self) -> int:
        n = len(self.programs) * len(self.targets) * len(self.shapes)
        for _, values in self.axes:
            n *= len(values)
        return n

    def variants(self) -> Iterator[Variant]:
        for program, target, binding in itertools.product(self.programs, self.targets,
                                                          self.shapes):
            for combo in itertools.product(*(values for _, values in self.axes)):
                options = {name: value for (name, _), value in zip(self.axes, combo)}
                variant = Variant(program, str(target), dict(binding), options)
                try:
                    RunOptions.parse(target, options)
                except OptionError as e:
                    raise SweepError(f"{self.path}: variant {variant.id}: {e.message}") \
                        from None
                yield variant


def _read_sweep(path: str) -> _Sweep:
    """Read and check one sweep file: its programs, targets, shapes and option axes."""
    r = _Reader(path)
    root = r.parse(_read_text(path))
    if root is None:
        raise SweepError(f"{path}: the sweep file is empty (it needs 'programs')")
    top = _top_level(r, root)
    programs = _programs(r, top["programs"])
    targets = _targets(r, top["targets"]) if "targets" in top else [Target("host")]
    shapes = _shapes(r, top["shapes"]) if "shapes" in top else [{}]
    axes = _option_axes(r, top["options"], targets[0]) if "options" in top else []
    return _Sweep(path, programs, targets, shapes, axes)


def _read_text(path: str) -> str:
    """The sweep file's text, which must be readable and UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SweepError(f"{path}: cannot read the sweep file: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SweepError(f"{path}: the sweep file is not UTF-8 text (byte {e.start} is "
                         f"{data[e.start]:#04x})") from None


def _top_level(r: _Reader, root: yaml.Node) -> dict[str, yaml.Node]:
    """The top-level mapping, key -> value node: known keys only, ``programs`` required."""
    top = {key: (key_node, value) for key, key_node, value in r.mapping(root, "a sweep file")}
    for key, (key_node, _) in top.items():
        if key not in TOP_LEVEL:
            raise r.error(f"unknown key '{key}' (expected {', '.join(TOP_LEVEL)})", key_node)
    if "programs" not in top:
        raise r.error("missing 'programs' (a list of program files)", root)
    return {key: value for key, (_, value) in top.items()}


def _programs(r: _Reader, node: yaml.Node) -> list[str]:
    """``programs``: paths relative to the sweep file, each an existing file."""
    base = os.path.dirname(os.path.abspath(r.path))
    programs: list[str] = []
    for item in r.sequence(node, "'programs'"):
        rel = r.scalar(item)
        if not isinstance(rel, str) or not rel.strip():
            raise r.error(f"a program must be a file path, got {rel!r}", item)
        full = os.path.normpath(os.path.join(base, os.path.expanduser(rel)))
        if not os.path.isfile(full):
            raise r.error(f"program '{rel}' not found (looked for {full})", item)
        programs.append(full)
    return programs


def _targets(r: _Reader, node: yaml.Node) -> list[Target]:
    """``targets``: each a target spelling ``Target.parse`` accepts."""
    targets: list[Target] = []
    for item in r.sequence(node, "'targets'"):
        text = r.scalar(item)
        try:
            targets.append(Target.parse(str(text)))
        except OptionError as e:
            raise r.error(e.message, item) from None
    return targets


def _shapes(r: _Reader, node: yaml.Node) -> list[dict[int, tuple[int, ...]]]:
    """``shapes``: each a ``{argN: AxB}`` binding."""
    shapes: list[dict[int, tuple[int, ...]]] = []
    for item in r.sequence(node, "'shapes'"):
        binding = {k: _shape_value(r, v) for k, _, v in r.mapping(item, "a shape binding")}
        try:
            shapes.append(parse_shapes(binding))
        except OptionError as e:
            raise r.error(e.message.replace("--shape ", "shape "), item) from None
    return shapes


def _option_axes(r: _Reader, node: yaml.Node, target: Target) -> list[tuple[str, list[Any]]]:
    """``options``: one axis per ``STAGE.NAME``, each value valid for ``target``."""
    axes: list[tuple[str, list[Any]]] = []
    for name, _, value_node in r.mapping(node, "'options'"):
        values = []
        for item in r.sequence(value_node, f"option axis '{name}'"):
            value = r.scalar(item)
            if value is None:
                raise r.error(f"option '{name}' has an empty value", item)
            try:
                RunOptions.parse(target, {name: value})
            except OptionError as e:
                raise r.error(e.message, item) from None
            values.append(value)
        axes.append((name, values))
    return axes


def _shape_value(r: _Reader, node: yaml.Node) -> str:
    value = r.scalar(node)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise r.error(f"a shape must look like 1024x1024, got {value!r}", node)
    return str(value)


def load_sweeps(paths: Iterable[str | os.PathLike[str]],
                max_variants: int = MAX_VARIANTS) -> list[Variant]:
    """The variants of several sweep files, in order; a variant id given twice is kept once.

    Every file is read and counted first; more than ``max_variants`` in all is a
    :class:`SweepError` before any variant is built.
    """
    sweeps = [_read_sweep(os.fspath(p)) for p in paths]
    total = sum(s.count for s in sweeps)
    for s in sweeps:
        if s.count > max_variants:
            raise SweepError(f"{s.path}: the sweep defines {s.count} variants, more than "
                             f"the limit of {max_variants} (raise it with --max-variants)")
    if total > max_variants:
        raise SweepError(f"the sweep files define {total} variants in all, more than the "
                         f"limit of {max_variants} (raise it with --max-variants)")
    out: list[Variant] = []
    for s in sweeps:
        out.extend(_dedupe(list(s.variants()), s.path))
    return _dedupe(out, "sweep files")


def _dedupe(variants: list[Variant], where: str) -> list[Variant]:
    seen: dict[str, Variant] = {}
    for v in variants:
        first = seen.setdefault(v.id, v)
        if first.program != v.program:
            raise SweepError(f"{where}: variant id {v.id} names two programs: "
                             f"{first.program} and {v.program} (rename one)")
    return list(seen.values())
