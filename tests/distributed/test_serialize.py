"""Products cross Dask as msgpack frames through the registered serializers, never pickle."""

from __future__ import annotations

import pickle

import pytest
from distributed import Client, LocalCluster
from distributed.protocol import (
    deserialize,
    deserialize_bytes,
    serialize,
    serialize_bytelist,
)

import accy.distributed as ad
from accy.distributed import serialize as accy_serialize
from accy.preparation.products import PRODUCTS, Product, SemanticModule

TEXT = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<4xf32>):
    %0 = "semantic.exp"(%x) : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }) : () -> ()
}) : () -> ()'''


@pytest.fixture
def semantic() -> SemanticModule:
    return SemanticModule.from_text(TEXT)


def every_product(sm: SemanticModule) -> list[Product]:
    return [cls(sm.clone_module(), {"stage": stage}) for stage, cls in PRODUCTS.items()]


def test_pickling_a_product_raises(semantic):
    for product in every_product(semantic):
        with pytest.raises(TypeError, match="never pickles"):
            pickle.dumps(product)


def test_every_product_class_is_registered():
    accy_serialize.register()
    accy_serialize.register()  # idempotent
    labels = accy_serialize.registered()
    for stage, cls in PRODUCTS.items():
        assert labels[f"{cls.__module__}.{cls.__qualname__}"] == stage


def test_products_serialize_as_their_wire_bytes_and_round_trip(semantic):
    for product in every_product(semantic):
        before = accy_serialize.counts()
        header, frames = serialize(product, serializers=("dask", "pickle"))
        assert header["serializer"] == "dask"
        assert header["sub-header"]["accy-label"] == product.stage
        assert [bytes(f) for f in frames] == [product.to_wire()]
        back = deserialize(header, frames)
        assert type(back) is type(product)
        assert back.fingerprint() == product.fingerprint() and back.meta == product.meta
        after = accy_serialize.counts()
        assert after["serialize"].get(product.stage, 0) == \
            before["serialize"].get(product.stage, 0) + 1
        assert after["deserialize"].get(product.stage, 0) == \
            before["deserialize"].get(product.stage, 0) + 1


def test_the_spill_path_uses_the_same_serializer(semantic):
    # Workers spill with serialize_bytelist / deserialize_bytes.
    frames = serialize_bytelist(semantic)
    back = deserialize_bytes(b"".join(bytes(f) for f in frames))
    assert isinstance(back, SemanticModule) and back.fingerprint() == semantic.fingerprint()


def test_register_type_moves_another_accy_type_as_bytes():
    class Descriptor:
        def __init__(self, text: str) -> None:
            self.text = text

        def __reduce_ex__(self, protocol):
            raise TypeError("no pickle")

    accy_serialize.register_type(Descriptor, lambda d: d.text.encode(),
                                 lambda b: Descriptor(b.decode()), label="descriptor")
    header, frames = serialize(Descriptor("fragment-7"), serializers=("dask", "pickle"))
    assert header["sub-header"]["accy-label"] == "descriptor" and bytes(frames[0]) == b"fragment-7"
    assert deserialize(header, frames).text == "fragment-7"
    assert accy_serialize.counts()["serialize"]["descriptor"] >= 1


def make_and_read(client: Client) -> tuple[str, str, str]:
    """A product made on worker A, read on worker B; returns (A, B, B's fingerprint)."""
    a, b = sorted(client.scheduler_info()["workers"])
    made = client.submit(SemanticModule.from_text, TEXT, workers=[a], pure=False)
    read = client.submit(Product.fingerprint, made, workers=[b], pure=False)
    return a, b, read.result()


def assert_crossed_as_msgpack(client: Client, a: str, b: str) -> None:
    counts = client.run(accy_serialize.counts)
    assert counts[a]["serialize"].get("semantic", 0) >= 1
    assert counts[b]["deserialize"].get("semantic", 0) >= 1
    assert counts[a]["deserialize"].get("semantic", 0) == 0  # A made it, never read one


@pytest.mark.slow
def test_a_product_crosses_real_worker_processes_as_msgpack(semantic):
    with LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      **ad.local_cluster_kwargs()) as cluster, Client(cluster) as client:
        a, b, fingerprint = make_and_read(client)
        assert fingerprint == semantic.fingerprint()
        assert_crossed_as_msgpack(client, a, b)
        # The client gathers one too, through the same serializer.
        before = accy_serialize.counts()["deserialize"].get("semantic", 0)
        got = client.submit(SemanticModule.from_text, TEXT, workers=[a], pure=False).result()
        assert got.fingerprint() == semantic.fingerprint()
        assert accy_serialize.counts()["deserialize"]["semantic"] == before + 1


@pytest.mark.slow
def test_ensure_plugin_reaches_workers_that_were_not_preloaded(semantic):
    with LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert ad.ensure_plugin(client) == {"version": 0}
        a, b, fingerprint = make_and_read(client)
        assert fingerprint == semantic.fingerprint()
        assert_crossed_as_msgpack(client, a, b)
