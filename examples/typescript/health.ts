// Health check with the standard grpc.health.v1 protocol. Exits 0 when SERVING.
//   npx tsx health.ts --addr 127.0.0.1:7433 [--service ostler.v1.SessionService]
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const addr = flag("addr", process.env.OSTLER_ADDR ?? "127.0.0.1:7433");
const service = flag("service", "");

const def = protoLoader.loadSync(path.join(here, "health.proto"), { keepCase: true, enums: String, defaults: true });
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const pkg = grpc.loadPackageDefinition(def) as any;
const client = new pkg.grpc.health.v1.Health(addr, grpc.credentials.createInsecure());

client.Check({ service }, { deadline: Date.now() + 10_000 }, (err: grpc.ServiceError | null, resp: { status: string }) => {
  if (err) {
    console.error(`health check failed: ${grpc.status[err.code]}: ${err.details}`);
    process.exit(1);
  }
  console.log(`${addr} ${service || "(daemon)"}: ${resp.status}`);
  process.exit(resp.status === "SERVING" ? 0 : 1);
});
