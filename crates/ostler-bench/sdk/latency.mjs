// Item c's baseline: the official TypeScript Agent SDK (`@anthropic-ai/claude-agent-sdk`),
// in process, with as many sessions as item c (each its own fake CLI), every session's CLI
// writing paced lines (`fake:paced RATE LINES`). Run by ostler-bench:
//   node latency.mjs CLI SESSIONS RATE LINES
// Each session runs a warm-up turn ("hello"); when all have, the paced turns start, spread
// evenly over one period as item c spreads them. The latency of a line is the time the SDK
// yields its assistant message (epoch clock) minus the `sent_ns=` the fake wrote into it
// just before writing the line. Prints one JSON line:
// {"latencies_us": [...], "cpu_secs": C} (C: this process's CPU time while the paced
// turns ran, user and system).
import { query } from "@anthropic-ai/claude-agent-sdk";
import { deferred, user } from "./common.mjs";

const [cli, sessions, rate, lines] = [
  process.argv[2],
  Number(process.argv[3]),
  Number(process.argv[4]),
  Number(process.argv[5]),
];
if (!cli || !(sessions > 0) || !(rate > 0) || !(lines > 0)) {
  console.error("usage: node latency.mjs CLI SESSIONS RATE LINES");
  process.exit(2);
}
// Microseconds since the epoch, the clock the fake stamps its lines with.
const nowUs = () => (performance.timeOrigin + performance.now()) * 1000;

const latencies = [];
const go = deferred();
const warmedUp = [];

async function session(i) {
  const ended = [deferred(), deferred()];
  warmedUp.push(ended[0].promise);
  async function* prompts() {
    yield user("hello");
    await ended[0].promise;
    const start = await go.promise;
    // Pacing, not synchronisation: session i starts i/sessions of a period after the others.
    const at = start + ((1000 / rate) * i) / sessions;
    await new Promise((r) => setTimeout(r, Math.max(0, at - performance.now())));
    yield user(`fake:paced ${rate} ${lines}`);
    await ended[1].promise;
  }
  let turn = 0;
  for await (const m of query({ prompt: prompts(), options: { pathToClaudeCodeExecutable: cli } })) {
    if (turn === 1 && m.type === "assistant") {
      const now = nowUs();
      for (const b of m.message.content) {
        const k = b.type === "text" ? b.text.indexOf("sent_ns=") : -1;
        if (k >= 0) {
          const sent = BigInt(/^\d+/.exec(b.text.slice(k + 8))[0]);
          latencies.push(now - Number(sent / 1000n));
        }
      }
    }
    if (m.type === "result") {
      ended[turn].resolve();
      turn++;
      if (turn === 2) break;
    }
  }
}

// Each call registers its warm-up turn before its first await.
const all = Array.from({ length: sessions }, (_, i) => session(i));
await Promise.all(warmedUp);
const cpu0 = process.cpuUsage();
go.resolve(performance.now() + 10);
await Promise.all(all);
const cpu = process.cpuUsage(cpu0);
console.log(JSON.stringify({ latencies_us: latencies, cpu_secs: (cpu.user + cpu.system) / 1e6 }));
