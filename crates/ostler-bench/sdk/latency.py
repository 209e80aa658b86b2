"""Item c's baseline: the official Python Agent SDK (`claude-agent-sdk`), in process, with
as many sessions as item c (each its own fake CLI), every session's CLI writing paced lines
(`fake:paced RATE LINES`). Run by ostler-bench:
    python latency.py CLI SESSIONS RATE LINES
Each session runs a warm-up turn ("hello"); when all have, the paced turns start, spread
evenly over one period as item c spreads them. The latency of a line is the time the SDK
yields its `AssistantMessage` (epoch clock) minus the `sent_ns=` the fake wrote into it
just before writing the line. Prints one JSON line: {"latencies_us": [...], "cpu_secs": C}
(C: this process's CPU time while the paced turns ran, user and system).
"""

import asyncio
import json
import re
import sys
import time

from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, ClaudeSDKClient, TextBlock

SENT = re.compile(r"sent_ns=(\d+)")


async def session(i, cli, sessions, rate, lines, warmed_up, go, latencies):
    async with ClaudeSDKClient(options=ClaudeAgentOptions(cli_path=cli)) as client:
        await client.query("hello")
        async for _ in client.receive_response():
            pass
        warmed_up.release()
        start = await go
        # Pacing, not synchronisation: session i starts i/sessions of a period after the others.
        at = start + (1.0 / rate) * i / sessions
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        await client.query(f"fake:paced {rate} {lines}")
        async for m in client.receive_response():
            if isinstance(m, AssistantMessage):
                now = time.time_ns()
                for b in m.content:
                    if isinstance(b, TextBlock) and (s := SENT.search(b.text)):
                        latencies.append((now - int(s.group(1))) / 1000)


async def main(cli, sessions, rate, lines):
    warmed_up = asyncio.Semaphore(0)
    go = asyncio.get_running_loop().create_future()
    latencies = []
    tasks = [
        asyncio.create_task(session(i, cli, sessions, rate, lines, warmed_up, go, latencies))
        for i in range(sessions)
    ]
    for _ in range(sessions):
        await warmed_up.acquire()
    cpu0 = time.process_time()
    go.set_result(time.monotonic() + 0.01)
    await asyncio.gather(*tasks)
    cpu = time.process_time() - cpu0
    print(json.dumps({"latencies_us": latencies, "cpu_secs": cpu}))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: python latency.py CLI SESSIONS RATE LINES")
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
