"""A client for tests/server/test_reliability.py: connects, says so, then waits to be killed (no goodbye).

python -m tests.server.vanishing_client URL
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from lipcast.streaming.rtc import restrict_host_addresses


async def main(url: str) -> None:
    restrict_host_addresses(["127.0.0.1"])
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.addTransceiver("video", direction="recvonly")
    connected = asyncio.Event()
    pc.on("connectionstatechange", lambda: connected.set() if pc.connectionState == "connected" else None)
    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r:
            answer = await r.json()
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    await asyncio.wait_for(connected.wait(), 15)
    print(answer["session_id"], flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
