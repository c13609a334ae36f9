/**
 * Scripted DNS for a service process under test, loaded before `main.ts` with
 * `deno run --preload tests/helpers/dns_answers_preload.ts`. `TEST_DNS_ANSWERS` holds JSON such as
 * `{"hooks.example.test": [["192.0.0.9"], ["127.0.0.1"]]}`: each A lookup of a listed name takes
 * the next answer (the last one repeats) and AAAA lookups of it find nothing, so a DNS answer can
 * change between two lookups as a rebinding attacker's does. Other names go to the real
 * `Deno.resolveDns`. Never part of what the service runs outside tests.
 */
const scripted: Record<string, string[][]> = JSON.parse(
  Deno.env.get("TEST_DNS_ANSWERS") ?? "{}",
);
const lookups = new Map<string, number>();
const realResolveDns = Deno.resolveDns;

// deno-lint-ignore no-explicit-any
(Deno as any).resolveDns = (
  name: string,
  type: Deno.RecordType,
  options?: Deno.ResolveDnsOptions,
): Promise<unknown> => {
  const answers = scripted[name.replace(/\.$/, "")];
  if (answers === undefined) return realResolveDns(name, type as "A", options);
  if (type !== "A") return Promise.resolve([]);
  const count = lookups.get(name) ?? 0;
  lookups.set(name, count + 1);
  return Promise.resolve(answers[Math.min(count, answers.length - 1)]);
};
