"""Item a's baseline: the official Python Agent SDK (`claude-agent-sdk`), in process,
driving the same fake CLI as the daemon does. Run by ostler-bench:
    python firehose.py CLI N
A warm-up turn (the same firehose, as the TypeScript script does), then `fake:firehose N`
again, timed from handing the SDK the prompt to the turn's `ResultMessage`; every message
the SDK yields in that turn is counted, nothing is stored.
Prints one JSON line: {"messages": M, "secs": S, "cpu_secs": C} (C: this process's CPU
time over the same span, user and system).
"""

import asyncio
import json
import sys
import time

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient


async def main(cli: str, n: int) -> None:
    options = ClaudeAgentOptions(cli_path=cli)
    async with ClaudeSDKClient(options=options) as client:
        await client.query(f"fake:firehose {n}")
        async for _ in client.receive_response():
            pass
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        await client.query(f"fake:firehose {n}")
        messages = 0
        async for _ in client.receive_response():
            messages += 1
        secs = time.perf_counter() - t0
        cpu_secs = time.process_time() - cpu0
    print(json.dumps({"messages": messages, "secs": secs, "cpu_secs": cpu_secs}))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python firehose.py CLI N")
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
