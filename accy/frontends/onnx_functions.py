"""ONNX function bodies: an op with no direct mapping imports as the ops of its schema's function.

ONNX defines many ops (``Attention``, ``NegativeLogLikelihoodLoss``,
``MeanVarianceNormalization``, …) by a *function*: a small graph of simpler
ONNX ops, fixed per opset (``schema.get_function_with_opset_version``) or
built from the node's attributes and input types
(``get_context_dependent_function_with_opset_version``). The front end
imports such a node as that body — the same expansion ONNX's own
``*_expanded`` node tests are made of — so every op the body uses needs a
mapping, and nothing else does.

Example
-------
>>> import onnx.helper as h
>>> n = h.make_node("Swish", ["x"], ["y"])
>>> nodes, opset = function_body(n, 24, [])
>>> [m.op_type for m in nodes], opset
(['Constant', 'CastLike', 'Mul', 'Sigmoid', 'Mul'], 24)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _pick(versions: Sequence[int], opset: int) -> int | None:
    """The newest function version at or below the model's opset."""
    usable = [v for v in versions if v <= opset]
    return max(usable) if usable else None


def function_body(node: Any, opset: int, input_types: Sequence[Any]) \
        -> tuple[list[Any], int] | None:
    """The nodes that define ``node`` at ``opset``, and the opset they are written in.

    ``input_types`` holds one ``TypeProto`` per node input (an empty one for an
    omitted input); context-dependent functions read them. Returns None when
    the op's schema defines no function (or none at this opset). Body names
    are prefixed with the node's output name, so they never collide with the
    graph's; attribute references (``ref_attr_name``) take the node's
    attributes, or the schema's defaults.
    """
    import onnx
    from onnx import defs

    try:
        schema: Any = defs.get_schema(node.op_type, opset, node.domain)
    except defs.SchemaError:
        return None
    node = onnx.NodeProto.FromString(node.SerializeToString())
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value and attr.default_value.type:
            node.attribute.append(attr.default_value)
    proto = onnx.FunctionProto()
    v = _pick(schema.function_opset_versions, opset)
    if v is not None:
        proto.ParseFromString(schema.get_function_with_opset_version(v))
    else:
        v = _pick(schema.context_dependent_function_opset_versions, opset)
        if v is None:
            return None
        try:
            text = schema.get_context_dependent_function_with_opset_version(
                v, node.SerializeToString(), [t.SerializeToString() for t in input_types])
        except Exception:  # onnx raises a bare RuntimeError/ValidationError for bad inputs
            return None
        proto.ParseFromString(text)
    body_opset = opset
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            body_opset = int(o.version)
    return _renamed(node, proto), body_opset


def _renamed(node: Any, proto: Any) -> list[Any]:
    """``proto``'s nodes with its formal inputs/outputs bound to ``node``'s names."""
    import onnx

    names: dict[str, str] = {}
    for i, formal in enumerate(proto.input):
        names[formal] = node.input[i] if i < len(node.input) else ""
    for i, formal in enumerate(proto.output):
        if i < len(node.output) and node.output[i]:
            names[formal] = node.output[i]
    prefix = f"{next((o for o in node.output if o), node.op_type)}/{node.op_type}/"
    attrs = {a.name: a for a in node.attribute}

    def rename(n: str) -> str:
        return names.get(n, prefix + n if n else "")

    out = []
    for inner in proto.node:
        m = onnx.NodeProto()
        m.CopyFrom(inner)
        del m.input[:]
        del m.output[:]
        del m.attribute[:]
        m.input.extend(rename(n) for n in inner.input)
        m.output.extend(rename(n) for n in inner.output)
        if m.name:
            m.name = prefix + m.name
        for a in inner.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    b = onnx.AttributeProto()
                    b.CopyFrom(attrs[a.ref_attr_name])
                    b.name = a.name
                    m.attribute.append(b)
            else:
                m.attribute.append(a)
        out.append(m)
    return out


__all__ = ["function_body"]
