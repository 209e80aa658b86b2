// A small ostler client built from proto/ alone (@grpc/grpc-js + @grpc/proto-loader, no
// generated code): creates a session, streams its events, answers the permission prompt
// it raises and prints the result. Exits 0 only when the turn succeeded and the answer
// was recorded by the daemon.
//   npx tsx client.ts --addr 127.0.0.1:7433 --cwd /some/dir "Create the file please"
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const protoDir = path.resolve(here, "..", "..", "proto");

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}
const positional = process.argv.slice(2).filter((a, i, all) => !a.startsWith("--") && !(i > 0 && all[i - 1].startsWith("--")));

const addr = flag("addr", process.env.OSTLER_ADDR ?? "127.0.0.1:7433");
const cwd = path.resolve(flag("cwd", process.cwd()));
const token = flag("token", process.env.OSTLER_TOKEN ?? "");
const prompt = positional[0] ?? "Create the file please";

// keepCase: field names as in the .proto; oneofs: a virtual field names the set member;
// enums as their names; uint64 (seq) as strings so nothing is rounded.
const def = protoLoader.loadSync(["ostler/v1/session.proto"], {
  includeDirs: [protoDir],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const v1 = (grpc.loadPackageDefinition(def) as any).ostler.v1;
// One event may be larger than gRPC's default 4 MiB receive limit (docs/api.md, Limits);
// keep-alive: a connection that dies silently ends the stream within seconds.
const sessions = new v1.SessionService(addr, grpc.credentials.createInsecure(), {
  "grpc.max_receive_message_length": 64 << 20,
  "grpc.keepalive_time_ms": 10000,
  "grpc.keepalive_timeout_ms": 10000,
  "grpc.keepalive_permit_without_calls": 1,
});

const md = new grpc.Metadata();
md.set("x-ostler-client", "typescript-example");
if (token) md.set("authorization", `Bearer ${token}`);

// eslint-disable-next-line @typescript-eslint/no-explicit-any
function call<T>(method: string, req: object): Promise<T> {
  return new Promise((resolve, reject) =>
    sessions[method](req, md, { deadline: Date.now() + 30_000 }, (err: grpc.ServiceError | null, resp: T) =>
      err ? reject(err) : resolve(resp),
    ),
  );
}

interface Session { id: string; state: string }

async function main(): Promise<number> {
  const session = await call<Session>("CreateSession", {
    cwd,
    first_prompt: { text: prompt },
    labels: { example: "typescript" },
  });
  console.log(`session ${session.id} (${session.state})`);

  let answered: string | null = null;
  let asking: string | null = null;
  let recorded: string | null = null;
  let lastSeq = "0";
  // follow: replay after after_seq, then live. To recover from a broken stream, subscribe
  // again with after_seq = lastSeq: every stored event arrives exactly once.
  const stream = sessions.Subscribe({ session_id: session.id, after_seq: 0, follow: true }, md);
  return await new Promise<number>((resolve) => {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    stream.on("data", async (ev: any) => {
      if (ev.seq !== "0") lastSeq = ev.seq;
      switch (ev.payload) {
        case "assistant_block": {
          const b = ev.assistant_block;
          if (b.block === "text") console.log("assistant:", b.text.text);
          if (b.block === "tool_use") console.log(`tool call: ${b.tool_use.name} ${b.tool_use.input_json}`);
          break;
        }
        case "permission_requested": {
          const r = ev.permission_requested;
          console.log(`permission asked: ${r.tool_name} ${r.input_json} -> allow`);
          // The PermissionResolved event may arrive before this call returns.
          asking = r.request_id;
          try {
            // eslint-disable-next-line @typescript-eslint/no-explicit-any
            const resp = await call<any>("RespondToPermission", {
              session_id: session.id,
              request_id: r.request_id,
              allow: { updated_input_json: "" },
            });
            answered = r.request_id;
            console.log(`answer recorded at seq ${resp.seq}: ${resp.resolved.resolution}`);
          } catch (e) {
            // FAILED_PRECONDITION: another client answered first; NOT_FOUND: withdrawn.
            const err = e as grpc.ServiceError;
            console.log(`answer refused: ${grpc.status[err.code]}: ${err.details}`);
          }
          break;
        }
        case "permission_resolved": {
          const r = ev.permission_resolved;
          if (r.request_id === asking) recorded = r.resolution;
          console.log(`permission ${r.resolution} by ${r.resolved_by}`);
          break;
        }
        case "tool_result":
          console.log("tool result:", ev.tool_result.is_error ? "error" : "ok");
          break;
        case "turn_completed": {
          const t = ev.turn_completed;
          console.log(`result: ${t.subtype} after ${t.num_turns} turns, $${t.total_cost_usd.toFixed(4)}: ${t.result}`);
          const ok = t.subtype === "success" && !t.is_error && answered !== null && recorded !== null;
          if (!ok) console.error(`FAILED: subtype=${t.subtype} is_error=${t.is_error} answered=${answered} recorded=${recorded}`);
          stream.cancel();
          resolve(ok ? 0 : 1);
          break;
        }
      }
    });
    stream.on("error", (err: grpc.ServiceError) => {
      if (err.code === grpc.status.CANCELLED) return;
      console.error(`stream failed after seq ${lastSeq}: ${grpc.status[err.code]}: ${err.details}`);
      resolve(1);
    });
    stream.on("end", () => {
      console.error("FAILED: the stream ended before the turn completed");
      resolve(1);
    });
  });
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(`FAILED: ${e?.code !== undefined ? grpc.status[e.code] + ": " + e.details : e}`);
    process.exit(1);
  },
);
