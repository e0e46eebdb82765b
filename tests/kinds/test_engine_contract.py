"""The generation contract fails loudly: an engine that leaves out one of
its members cannot be built, and the daemon refuses, as a failed load that
names it, an engine of a generating kind that does not implement it at all
(rather than a request finding out, or quietly doing less)."""

from __future__ import annotations

import pytest
from support.echo_engine import EchoEngine
from support.residency_sim import manager, spec

from mlxd.daemon.engines import ContractChecked
from mlxd.distributed.engine import GangEngine
from mlxd.engine.contract import GenerationEngine
from mlxd.engine.text import TextEngine
from mlxd.engine.vision import VisionEngine
from mlxd.errors import ModelLoadFailed
from mlxd.registry.model import Registry, ServerSpec
from mlxd.remote.engine import RemoteEngine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("member", sorted(GenerationEngine.__abstractmethods__))
def test_an_engine_without_one_member_of_the_contract_cannot_be_built(member):
    lacking = type("Lacking", (GenerationEngine,), {k: v for k, v in vars(EchoEngine).items() if k != member})
    with pytest.raises(TypeError, match=rf"abstract method.*\b{member}\b"):
        lacking(spec("e", 1))


@pytest.mark.parametrize("engine", [TextEngine, VisionEngine, RemoteEngine, GangEngine, EchoEngine])
def test_every_generation_engine_implements_the_whole_contract(engine):
    assert issubclass(engine, GenerationEngine) and not engine.__abstractmethods__


class Quacks:
    """Everything an engine used to be asked, but not the contract."""

    kind, measured_bytes, batching, wants_image_urls = "text", None, False, False

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_the_daemon_refuses_an_engine_of_a_generating_kind_without_the_contract():
    built = Quacks()

    async def factory(model, registry):
        return built

    chat, embed = spec("chat", 1), spec("embed", 1, kind="embedding")
    registry = Registry(source_path=None, file_hash="x", manager=manager(8), server=ServerSpec(), models=(chat, embed))
    with pytest.raises(ModelLoadFailed, match="`chat` is a text model but its engine \\(Quacks\\) does not implement"):
        await ContractChecked(factory)(chat, registry)
    assert built.closed, "what was built is given back"
    # A kind that does not generate (embeddings) is held to its own path's needs only.
    assert await ContractChecked(factory)(embed, registry) is built
