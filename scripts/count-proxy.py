#!/usr/bin/env python3
"""A TCP relay that counts: listens on 127.0.0.1:PORT, relays every
connection to TARGET (host:port) unchanged (TLS passes through), and keeps
the totals (connections, bytes each way) in OUT as JSON, rewritten after
every connection closes. scripts/node-cni-cost.sh puts it between the
node's CNI plugin and the API server to measure what the plugin's calls
cost on the wire.

Usage: count-proxy.py PORT TARGET OUT
"""
import asyncio
import json
import os
import sys

totals = {"connections": 0, "bytes_up": 0, "bytes_down": 0}


async def pump(reader, writer, key):
    try:
        while data := await reader.read(65536):
            totals[key] += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def relay(client_reader, client_writer, target, out):
    host, port = target.rsplit(":", 1)
    totals["connections"] += 1
    try:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(
        pump(client_reader, server_writer, "bytes_up"),
        pump(server_reader, client_writer, "bytes_down"),
    )
    with open(out + ".tmp", "w") as f:
        json.dump(totals, f)
    os.replace(out + ".tmp", out)


async def main():
    port, target, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = await asyncio.start_server(
        lambda r, w: relay(r, w, target, out), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()


asyncio.run(main())
