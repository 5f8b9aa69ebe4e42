"""The integration fixture gives a working JetStream server on loopback."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from natscontainer import (
    IMAGE_ENV_VAR,
    PINNED_IMAGE,
    ContainerNatsServer,
    client_options,
    container_image,
)
from natsfixture import NatsServer, docker_answers, restartable_server
from workerset_admission.adapters.nats.embedded import (
    find_nats_server_binary,
    nats_server_version,
)

pytestmark = pytest.mark.integration


async def test_the_session_server_speaks_jetstream_on_loopback(nats_server: NatsServer) -> None:
    assert "127.0.0.1" in nats_server.url or nats_server.kind == "container"
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()


async def test_a_restartable_server_comes_back_on_the_same_port_with_its_store(
    nats_server_fn: NatsServer,
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    nc = await nats.connect(nats_server_fn.url)
    kv = await nc.jetstream().create_key_value(bucket="keep")
    await kv.put("a", b"1")
    await nc.close()

    handle.restart(kill=True)
    nc = await nats.connect(nats_server_fn.url)
    try:
        kv = await nc.jetstream().key_value("keep")
        assert (await kv.get("a")).value == b"1"
    finally:
        await nc.close()

    handle.restart(wipe=True)
    nc = await nats.connect(nats_server_fn.url)
    try:
        with pytest.raises(nats.js.errors.BucketNotFoundError):
            await nc.jetstream().key_value("keep")
    finally:
        await nc.close()


def test_the_default_image_is_the_binary_release_never_a_moving_tag() -> None:
    binary_version = nats_server_version(find_nats_server_binary())
    assert f"nats:{binary_version.removeprefix('v')}" == PINNED_IMAGE
    assert not PINNED_IMAGE.endswith(":latest")


def test_the_image_setting_chooses_the_container_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IMAGE_ENV_VAR, "localhost/nats:2.15.1")
    assert container_image() == "localhost/nats:2.15.1"
    monkeypatch.setenv(IMAGE_ENV_VAR, "")
    assert container_image() == PINNED_IMAGE


@pytest.mark.skipif(not docker_answers(), reason="no Docker-compatible API answers")
def test_a_failing_test_still_has_its_container_removed(tmp_path: Path) -> None:
    import docker  # type: ignore[import-untyped]

    servers = restartable_server(tmp_path)
    server = next(servers)
    assert server.kind == "container"
    assert isinstance(server.handle, ContainerNatsServer)
    first = server.handle.container_id
    server.handle.restart(wipe=True)
    second = server.handle.container_id
    assert first is not None
    assert second is not None
    assert first != second
    with pytest.raises(RuntimeError, match="the test failed"):
        servers.throw(RuntimeError("the test failed"))
    client = docker.from_env(**client_options())
    try:
        for container_id in (first, second):
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(container_id)
    finally:
        client.close()
