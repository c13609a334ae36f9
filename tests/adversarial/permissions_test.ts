/**
 * Least privilege, from outside: the service started as an operator starts it (`deno task
 * start`, with a DATA_DIR of their choosing) boots and runs with scoped permissions; code running
 * with those permissions, as a compromised dependency would, cannot read the operator's other
 * files or variables, write outside DATA_DIR, load another native library or start a process;
 * and the scoped service still verifies and relays with the OpenSSL engine.
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { LIBCRYPTO_PATHS } from "../../src/crypto/es256.ts";
import { servicePermissions } from "../../src/process/permissions.ts";
import {
  ENGINE,
  freshDatabase,
  type RunningService,
  startService,
  stopAndDrop,
  TEST_ENCRYPTION_KEY,
} from "../helpers/service.ts";
import { storeaCredentialArgs, TEST_ISSUER_ID, writeStoreaKeyFile } from "../helpers/fixtures.ts";
import {
  assertReceipt,
  assertSignedDelivery,
  cliOk,
  createTenantWithCallback,
  postJson,
} from "../helpers/relay.ts";
import { createStoreaTestPki, writeStoreaRootPem } from "../../simulators/storea_pki.ts";
import { StoreaSigner } from "../../simulators/storea_signer.ts";
import { startStoreaApiSimulator } from "../../simulators/storea_api.ts";
import { startCallbackReceiver } from "../../simulators/callback_receiver.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const MAIN = join(ROOT, "main.ts");

/** The environment a shell would pass on: the tools' variables, no configuration. */
function shellEnv(): Record<string, string> {
  const env: Record<string, string> = { NO_COLOR: "1" };
  for (const name of ["PATH", "HOME", "DENO_DIR", "DENO_TLS_CA_STORE"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** The command line of a process, from `ps` (Deno reads no `/proc/<pid>` without -A). */
async function commandLine(pid: number): Promise<string[]> {
  const { stdout } = await new Deno.Command("ps", { args: ["-o", "args=", "-p", String(pid)] })
    .output();
  return new TextDecoder().decode(stdout).trim().split(/\s+/).filter((word) => word !== "");
}

/** The processes whose parent is `pid`. */
async function childrenOf(pid: number): Promise<number[]> {
  const { stdout } = await new Deno.Command("ps", { args: ["-o", "pid=", "--ppid", String(pid)] })
    .output();
  return new TextDecoder().decode(stdout).split("\n").filter((l) => l.trim()).map(Number);
}

/** The service process under `deno task start`: the task runs the launcher, which runs it. */
async function serviceUnder(taskPid: number): Promise<number> {
  for (const launcher of await childrenOf(taskPid)) {
    for (const child of await childrenOf(launcher)) {
      if ((await commandLine(child)).includes(MAIN)) return child;
    }
  }
  throw new Error(`no main.ts process under ${taskPid}`);
}

interface TaskService {
  child: Deno.ChildProcess;
  lines: string[];
  listening: Promise<Record<string, unknown>>;
}

/** Runs `deno task start` as an operator would, in the checkout, with `env` on top of a shell's. */
function denoTaskStart(env: Record<string, string>, options: { ownGroup?: boolean } = {}) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", "start"],
    cwd: ROOT,
    env: { ...shellEnv(), ...env },
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
    detached: options.ownGroup ?? false,
  }).spawn();
  const lines: string[] = [];
  const listening = Promise.withResolvers<Record<string, unknown>>();
  (async () => {
    let pending = "";
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
      pending += chunk;
      let newline;
      while ((newline = pending.indexOf("\n")) !== -1) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        lines.push(line);
        const record = JSON.parse(line);
        if (record.msg === "listening") listening.resolve(record);
        if (record.level === "fatal") listening.reject(new Error(line));
      }
    }
    listening.reject(new Error(`deno task start ended: ${lines.join("\n")}`));
  })();
  let stderr = "";
  (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) stderr += chunk;
  })();
  const timer = setTimeout(
    () => listening.reject(new Error(`no listening line: ${stderr}`)),
    60_000,
  );
  listening.promise.finally(() => clearTimeout(timer)).catch(() => {});
  return { child, lines, listening: listening.promise } satisfies TaskService;
}

/** The configuration of a service that must write in DATA_DIR on either engine. */
async function configWritingDataDir(): Promise<
  { env: Record<string, string>; drop(): Promise<void> }
> {
  const db = await freshDatabase();
  // Embedded: the engine lives in DATA_DIR. PostgreSQL: without ENCRYPTION_KEY the development
  // key is generated into DATA_DIR.
  const env: Record<string, string> = {
    ...db.env,
    NODE_ENV: "test",
    PORT: "0",
    HOST: "127.0.0.1",
    ...(ENGINE === "embedded" ? { ENCRYPTION_KEY: TEST_ENCRYPTION_KEY } : {}),
  };
  return { env, drop: () => db.drop() };
}

Deno.test("permissions: deno task start with DATA_DIR elsewhere boots, scoped, and stops on SIGTERM", async () => {
  const { env, drop } = await configWritingDataDir();
  const task = denoTaskStart(env);
  try {
    const listening = await task.listening;
    assert.equal(listening.cryptoEngine, "openssl");
    const ready = await fetch(`http://127.0.0.1:${listening.port}/ready`);
    assert.equal(ready.status, 200, await ready.text());

    // The running service's own command line: exactly the flags its configuration gives.
    const pid = await serviceUnder(task.child.pid);
    assert.deepEqual(await commandLine(pid), [
      Deno.execPath(),
      "run",
      ...servicePermissions(env),
      MAIN,
      "serve",
    ]);
    assert.ok(
      await Deno.stat(join(env.DATA_DIR, ENGINE === "embedded" ? "pglite" : "encryption.key")),
    );

    // SIGTERM to the task, as a process manager sends it: the service drains once and exits 0.
    task.child.kill("SIGTERM");
    const status = await task.child.status;
    assert.equal(status.code, 0);
    const shutdowns = task.lines.filter((line) => line.includes('"msg":"shutdown"'));
    assert.equal(shutdowns.length, 1);
    assert.match(shutdowns[0], /"signal":"SIGTERM"/);
    assert.deepEqual(await commandLine(pid), []);
  } finally {
    try {
      task.child.kill("SIGKILL");
    } catch {
      // exited
    }
    await task.child.status;
    await drop();
  }
});

Deno.test("permissions: Ctrl-C in a terminal reaches the service under deno task start once", async () => {
  const { env, drop } = await configWritingDataDir();
  // Its own process group, as a terminal's foreground job: the signal goes to the whole group.
  const task = denoTaskStart(env, { ownGroup: true });
  try {
    await task.listening;
    Deno.kill(-task.child.pid, "SIGINT");
    const status = await task.child.status;
    // A second SIGINT during the drain would end the service at once (exit 130).
    assert.equal(status.code, 0, task.lines.join("\n"));
    const shutdowns = task.lines.filter((line) => line.includes('"msg":"shutdown"'));
    assert.deepEqual(shutdowns.length, 1);
    assert.match(shutdowns[0], /"signal":"SIGINT"/);
  } finally {
    try {
      Deno.kill(-task.child.pid, "SIGKILL");
    } catch {
      // exited
    }
    await task.child.status;
    await drop();
  }
});

/**
 * What a compromised dependency inside the service would try, run with the service's own
 * permissions: each attempt prints its outcome.
 */
const PROBE = `
const [secretFile, dataDir, outsideDir, otherLibrary, libcrypto] = Deno.args;
const outcome = {};
async function attempt(name, action) {
  try {
    outcome[name] = "ok " + String(await action());
  } catch (error) {
    outcome[name] = error.name;
  }
}
await attempt("read a file outside", () => Deno.readTextFile(secretFile));
await attempt("read /etc/passwd", () => Deno.readTextFile("/etc/passwd"));
await attempt("list the home directory", () => Array.fromAsync(Deno.readDir(Deno.env.get("HOME") ?? "/root")));
await attempt("write outside DATA_DIR", () => Deno.writeTextFile(outsideDir + "/planted", "x"));
await attempt("write in DATA_DIR", () => Deno.writeTextFile(dataDir + "/probe", "x"));
await attempt("read in DATA_DIR", () => Deno.readTextFile(dataDir + "/probe"));
await attempt("read a variable outside the configuration", () => Deno.env.get("CLOUD_SECRET_KEY"));
await attempt("list the variables", () => Object.keys(Deno.env.toObject()).includes("CLOUD_SECRET_KEY"));
await attempt("read its own configuration", () => Deno.env.get("DATA_DIR") === dataDir);
await attempt("load another library", () => Deno.dlopen(otherLibrary, {}));
await attempt("load libcrypto", () => typeof Deno.dlopen(libcrypto, {}));
await attempt("run a process", () => new Deno.Command("sh", { args: ["-c", "true"] }).output());
await attempt("read the host name", () => Deno.hostname());
await attempt("reach the cloud metadata service", () => Deno.connect({ hostname: "169.254.169.254", port: 80 }));
await attempt("reach it over IPv6", () => Deno.connect({ hostname: "fd00:ec2::254", port: 80 }));
console.log(JSON.stringify(outcome));
`;

Deno.test("permissions: code running with the service's permissions stays in its sandbox", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-sandbox-" });
  const dataDir = join(dir, "state");
  const outside = join(dir, "operator");
  await Deno.mkdir(dataDir);
  await Deno.mkdir(outside);
  const secretFile = join(outside, "relay.env");
  await Deno.writeTextFile(secretFile, "DATABASE_URL=postgres://relay:hunter2@db/relay\n");
  const probe = join(dir, "probe.js");
  await Deno.writeTextFile(probe, PROBE);
  const env = { DATA_DIR: dataDir, NODE_ENV: "test", ENCRYPTION_KEY: TEST_ENCRYPTION_KEY };
  const libcrypto = LIBCRYPTO_PATHS.find((path) => {
    try {
      return Deno.statSync(path).isFile;
    } catch {
      return false;
    }
  });
  try {
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        ...servicePermissions(env),
        probe,
        secretFile,
        dataDir,
        outside,
        join(dirname(LIBCRYPTO_PATHS[0]), "libssl.so.3"),
        libcrypto ?? LIBCRYPTO_PATHS[0],
      ],
      env: { ...shellEnv(), ...env, CLOUD_SECRET_KEY: "sk-live-123" },
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    const outcome = JSON.parse(new TextDecoder().decode(output.stdout));
    assert.deepEqual(outcome, {
      "read a file outside": "NotCapable",
      "read /etc/passwd": "NotCapable",
      "list the home directory": "NotCapable",
      "write outside DATA_DIR": "NotCapable",
      "write in DATA_DIR": "ok undefined",
      "read in DATA_DIR": "ok x",
      "read a variable outside the configuration": "ok undefined",
      "list the variables": "ok false",
      "read its own configuration": "ok true",
      "load another library": "NotCapable",
      "load libcrypto": libcrypto ? "ok object" : "Error",
      "run a process": "NotCapable",
      "read the host name": "NotCapable",
      "reach the cloud metadata service": "NotCapable",
      "reach it over IPv6": "NotCapable",
    });
    await assert.rejects(Deno.stat(join(outside, "planted")), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("permissions: the scoped service verifies and relays store A with OpenSSL", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pr-scoped-" });
  const pki = await createStoreaTestPki();
  const signer = new StoreaSigner(pki, { bundleId: "com.example.app", environment: "Production" });
  const api = await startStoreaApiSimulator({ signer });
  const receiver = await startCallbackReceiver();
  const keyFile = await writeStoreaKeyFile(dir);
  await api.addKey({
    issuerId: TEST_ISSUER_ID,
    keyId: "ABC123DEFG",
    bundleId: "com.example.app",
    privateKeyPem: await Deno.readTextFile(keyFile),
  });
  let service: RunningService | undefined;
  try {
    service = await startService({
      env: {
        ...api.serviceEnv,
        STOREA_ROOT_CERTS: await writeStoreaRootPem(pki, join(dir, "root.pem")),
        CALLBACK_ALLOW_INSECURE: "true",
      },
    });
    assert.equal(service.logs.find((l) => l.msg === "listening")?.cryptoEngine, "openssl");
    const flags = (await commandLine(service.pid)).filter((word) => word.startsWith("-"));
    assert.deepEqual(
      flags.filter((flag) =>
        /^--allow-(read|write|env|ffi|sys)$|^--allow-(all|run)|^-A$/.test(flag)
      ),
      [],
      `unscoped: ${flags.join(" ")}`,
    );
    assert.ok(flags.includes(`--allow-ffi=${LIBCRYPTO_PATHS.join(",")}`), flags.join(" "));

    const { tenantId, secret } = await createTenantWithCallback(service, receiver.url);
    receiver.setSecrets([secret!]);
    const { key } = await cliOk(service, "key", "create", tenantId, "--env", "test");
    // The CLI reads the key file through its own scoped permissions (--private-key-file).
    await cliOk(service, ...storeaCredentialArgs(tenantId, keyFile), "--app-id", "1234567890");

    const tx = signer.sampleTransaction({
      transactionId: "3000000000000001",
      originalTransactionId: "3000000000000000",
    });
    await api.addTransaction("production", tx);
    const verified = await postJson(
      `${service.url}/v1/storea/verify`,
      { transactionId: "3000000000000001" },
      { authorization: `Bearer ${key}` },
    );
    assert.equal(verified.status, 200, JSON.stringify(verified.json));
    assert.equal(verified.json.valid, true);
    assert.equal(verified.json.transaction.transactionId, "3000000000000001");

    const payload = await signer.notificationPayload({
      appAppleId: 1234567890,
      notificationType: "DID_RENEW",
      transaction: tx,
    });
    const answer = await postJson(`${service.url}/v1/webhooks/storea/${tenantId}`, {
      signedPayload: await signer.signNotification(payload),
    });
    const eventId = assertReceipt(answer, {
      externalId: payload.notificationUUID,
      isNew: true,
      enqueuedDelivery: true,
    });
    const [delivery] = await receiver.waitFor(1, 15_000);
    assertSignedDelivery(delivery, { event: "subscription.renewed", eventId });
  } finally {
    if (service) await stopAndDrop(service);
    await receiver.close();
    await api.close();
    await Deno.remove(dir, { recursive: true });
  }
});
