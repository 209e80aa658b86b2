// Item a's baseline: the official TypeScript Agent SDK (`@anthropic-ai/claude-agent-sdk`),
// in process, driving the same fake CLI as the daemon does. Run by ostler-bench:
//   node firehose.mjs CLI N
// A warm-up turn (the same firehose: V8 compiles the SDK's hot code while it runs), then
// `fake:firehose N` again, timed from handing the SDK the prompt to the turn's `result`;
// every message the SDK yields in that turn is counted, nothing is stored.
// Prints one JSON line: {"messages": M, "secs": S, "cpu_secs": C} (C: this process's CPU
// time over the same span, user and system).
import { query } from "@anthropic-ai/claude-agent-sdk";
import { deferred, user } from "./common.mjs";

const [cli, n] = [process.argv[2], Number(process.argv[3])];
if (!cli || !(n > 0)) {
  console.error("usage: node firehose.mjs CLI N");
  process.exit(2);
}

// The prompts, one per turn: the next is handed over when the turn before has ended.
const ended = [deferred(), deferred()];
let t0 = 0n;
let cpu0;
async function* prompts() {
  yield user(`fake:firehose ${n}`);
  await ended[0].promise;
  t0 = process.hrtime.bigint();
  cpu0 = process.cpuUsage();
  yield user(`fake:firehose ${n}`);
  await ended[1].promise;
}

let messages = 0;
let turn = 0;
for await (const m of query({ prompt: prompts(), options: { pathToClaudeCodeExecutable: cli } })) {
  if (turn === 1) messages++;
  if (m.type === "result") {
    ended[turn].resolve();
    turn++;
    if (turn === 2) break;
  }
}
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = process.cpuUsage(cpu0);
console.log(JSON.stringify({ messages, secs, cpu_secs: (cpu.user + cpu.system) / 1e6 }));
