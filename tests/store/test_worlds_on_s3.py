"""Saved worlds through the server on an S3-compatible store (moto's, on loopback): saved by one
session, listed, forked by another, deleted."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
from aiohttp.test_utils import TestServer

from tests.server.harness import TEST_SETTINGS, fake_factory, frames, recv, recv_type, send
from worldserve.protocol import Save, Saved, Start, Started
from worldserve.server.cluster.worker import create_worker
from worldserve.server.keys import SERVICE
from worldserve.server.store import FsspecStore


def _bucket(endpoint: str) -> FsspecStore:
    import boto3

    bucket = f"worlds-{time.monotonic_ns()}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    return FsspecStore(f"s3://{bucket}/worldserve", key="testing", secret="testing",
                       client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})


async def test_a_world_saved_on_s3_is_listed_forked_and_deleted(s3_endpoint: str) -> None:
    store = await asyncio.to_thread(_bucket, s3_endpoint)
    app = create_worker(replace(TEST_SETTINGS, store="none"), runner_factory=fake_factory(), store=store)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            while not app[SERVICE].ready:
                await asyncio.sleep(0.02)
            ws = await http.ws_connect(str(server.make_url("/v1/ws")))
            await send(ws, Start("a harbour", seed=2))
            st = await recv(ws)
            assert isinstance(st, Started)
            await frames(ws, 4)
            await send(ws, Save("harbour"))
            saved = await recv_type(ws, Saved)
            assert isinstance(saved, Saved)
            listed = await (await http.get(server.make_url("/v1/worlds"))).json()
            assert [w["id"] for w in listed["worlds"]] == [saved.world]
            fork = await http.ws_connect(str(server.make_url("/v1/ws")))
            await send(fork, Start(world=saved.world))
            forked = await recv(fork)
            assert isinstance(forked, Started) and forked.block_idx == saved.block_idx
            assert (await frames(fork, 2))[0].block_idx == saved.block_idx
            gone = await http.delete(server.make_url(f"/v1/worlds/{saved.world}"),
                                     headers={"X-Session-Token": st.token})
            assert gone.status == 200
            assert (await (await http.get(server.make_url("/v1/worlds"))).json())["worlds"] == []
            for w in (ws, fork):
                await w.close()
    finally:
        await server.close()
