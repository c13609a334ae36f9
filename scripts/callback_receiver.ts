/**
 * `deno task callback-receiver`: a stand-in for a tenant's webhook endpoint, for trying the
 * relay before a backend handles deliveries. It listens on localhost (127.0.0.1, and ::1 where
 * there is IPv6), checks each delivery's signature with the webhook secret, answers as a careful
 * backend does (401 to a bad signature, else 200 or `--status`), and prints what arrived.
 *
 * @module
 */
import { parseArgs } from "node:util";
import {
  type CallbackReceiver,
  type ReceivedDelivery,
  startCallbackReceiver,
} from "../simulators/callback_receiver.ts";
import { bold, dim, green, red } from "./terminal.ts";

const USAGE =
  `usage: deno task callback-receiver [--port 3000] [--path /webhooks] [--secret whsec_...]
                                      [--status 200]

Listens on http://localhost:PORT/PATH for the service's deliveries and prints each one. With
--secret (the tenant's webhook secret, repeatable during a rotation) it checks X-Service-Signature
and answers 401 when it does not verify; --status sets the answer to the others (e.g. 500, to
watch the retries).`;

async function main(args: string[]): Promise<number> {
  let options;
  try {
    options = parseArgs({
      args,
      options: {
        port: { type: "string", default: "3000" },
        path: { type: "string", default: "/webhooks" },
        secret: { type: "string", multiple: true, default: [] },
        status: { type: "string", default: "200" },
        help: { type: "boolean", short: "h", default: false },
      },
    }).values;
  } catch (error) {
    console.error(`${(error as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (options.help) {
    console.log(USAGE);
    return 0;
  }
  const port = Number(options.port);
  const status = Number(options.status);
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    console.error(`--port must be a port number, not ${options.port}\n\n${USAGE}`);
    return 2;
  }
  if (!Number.isInteger(status) || status < 200 || status > 599) {
    console.error(`--status must be an HTTP status from 200 to 599\n\n${USAGE}`);
    return 2;
  }
  if (!options.path.startsWith("/")) {
    console.error(`--path must start with /\n\n${USAGE}`);
    return 2;
  }

  const secrets = options.secret;
  const receivers: CallbackReceiver[] = [];
  for (const address of ["127.0.0.1", "::1"] as const) {
    try {
      const receiver = await startCallbackReceiver({
        port,
        address,
        path: options.path,
        secrets,
        rejectInvalidSignatures: secrets.length > 0,
        onAnswered: (delivery) => printDelivery(delivery, secrets.length > 0),
      });
      if (status !== 200) receiver.script({ status, times: Infinity });
      receivers.push(receiver);
    } catch (error) {
      // No IPv6 on this machine is fine; the port being taken on IPv4 is not.
      if (address === "127.0.0.1") {
        console.error(red(`cannot listen on 127.0.0.1:${port}: ${(error as Error).message}`));
        return 1;
      }
    }
  }
  console.log(
    bold(`Listening on http://localhost:${port}${options.path}`),
    secrets.length > 0
      ? dim("(signatures checked; a bad one is answered 401)")
      : dim("(signatures not checked: give --secret whsec_... to check them)"),
  );
  console.log(dim("Ctrl-C stops it."));
  const stopped = Promise.withResolvers<void>();
  Deno.addSignalListener("SIGINT", () => stopped.resolve());
  Deno.addSignalListener("SIGTERM", () => stopped.resolve());
  await stopped.promise;
  await Promise.all(receivers.map((receiver) => receiver.close()));
  return 0;
}

/** One delivery: what it is, whether its signature verifies, what it was answered. */
function printDelivery(delivery: ReceivedDelivery, checked: boolean): void {
  const headers = delivery.headers;
  const signature = headers["x-service-signature"] === undefined
    ? red("no signature")
    : !checked
    ? dim("signature not checked")
    : delivery.signatureValid
    ? green("signature valid")
    : red("signature INVALID");
  const answered = delivery.answeredStatus || "no answer";
  console.log(
    `\n${
      new Date(delivery.receivedAt).toISOString()
    } ${delivery.method} ${delivery.path} -> ${answered}`,
  );
  console.log(
    `  ${headers["x-service-event"] ?? "-"} ${headers["x-service-event-id"] ?? "-"} ${signature}`,
  );
  const body = delivery.json;
  if (body === null || typeof body !== "object") {
    console.log(dim(`  ${delivery.body.slice(0, 500)}`));
    return;
  }
  // data and raw repeat the store's notification: summed up, or the rest scrolls away.
  const { data, raw, ...rest } = body as Record<string, unknown>;
  const summary = { ...rest, data: sizeOf(data), raw: sizeOf(raw) };
  for (const line of JSON.stringify(summary, null, 2).split("\n")) console.log(`  ${line}`);
}

function sizeOf(value: unknown): string {
  return value === undefined ? "(none)" : `(${JSON.stringify(value).length} bytes of JSON)`;
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
