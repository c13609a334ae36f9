/**
 * The route table: every endpoint of the service, once. The server routes by it, and the OpenAPI
 * test and the fuzzer read it, so an endpoint added here is served, documented and fuzzed or
 * fails a test. Adding one: its module in this folder (a handler factory), a row here, and its
 * operation in docs/openapi.yaml.
 */
import type { Handler, Route } from "../http/router.ts";
import { type HealthDeps, healthHandler, readyHandler } from "./health.ts";
import { type StoreaVerifyDeps, storeaVerifyHandler } from "./storea_verify.ts";
import { type StorebVerifyDeps, storebVerifyHandler } from "./storeb_verify.ts";
import { type StoreaWebhookDeps, storeaWebhookHandler } from "./storea_webhook.ts";
import { type StorebWebhookDeps, storebWebhookHandler } from "./storeb_webhook.ts";
import { storebAcknowledgeHandler } from "./storeb_acknowledge.ts";
import { storebConsumeHandler } from "./storeb_consume.ts";
import { storeaSubscriptionsHandler } from "./storea_subscriptions.ts";
import { storeaHistoryHandler } from "./storea_history.ts";
import { storeaConsumptionHandler } from "./storea_consumption.ts";

/** Everything the endpoints need, built once by the composition root (src/process/app.ts). */
export type ApiDeps =
  & HealthDeps
  & StoreaVerifyDeps
  & StorebVerifyDeps
  & StoreaWebhookDeps
  & StorebWebhookDeps;

/** How an endpoint authenticates its caller (docs/integration.md, "Authentication"). */
export type EndpointAuth = "none" | "api-key" | "store-a-jws" | "store-b-push-token";

/** One endpoint: its name, method, path pattern (`:name` segments), and handler factory. */
export interface Endpoint {
  name: string;
  method: "GET" | "POST";
  pattern: string;
  auth: EndpointAuth;
  handler: (deps: ApiDeps) => Handler;
}

/** Every endpoint of the service. */
export const ENDPOINTS = [
  { name: "health", method: "GET", pattern: "/health", auth: "none", handler: healthHandler },
  { name: "ready", method: "GET", pattern: "/ready", auth: "none", handler: readyHandler },
  {
    name: "storea-verify",
    method: "POST",
    pattern: "/v1/storea/verify",
    auth: "api-key",
    handler: storeaVerifyHandler,
  },
  {
    name: "storeb-verify",
    method: "POST",
    pattern: "/v1/storeb/verify",
    auth: "api-key",
    handler: storebVerifyHandler,
  },
  {
    name: "storeb-acknowledge",
    method: "POST",
    pattern: "/v1/storeb/acknowledge",
    auth: "api-key",
    handler: storebAcknowledgeHandler,
  },
  {
    name: "storeb-consume",
    method: "POST",
    pattern: "/v1/storeb/consume",
    auth: "api-key",
    handler: storebConsumeHandler,
  },
  {
    name: "storea-subscriptions",
    method: "POST",
    pattern: "/v1/storea/subscriptions",
    auth: "api-key",
    handler: storeaSubscriptionsHandler,
  },
  {
    name: "storea-history",
    method: "POST",
    pattern: "/v1/storea/history",
    auth: "api-key",
    handler: storeaHistoryHandler,
  },
  {
    name: "storea-consumption",
    method: "POST",
    pattern: "/v1/storea/consumption",
    auth: "api-key",
    handler: storeaConsumptionHandler,
  },
  {
    name: "storea-webhook",
    method: "POST",
    pattern: "/v1/webhooks/storea/:tenantId",
    auth: "store-a-jws",
    handler: storeaWebhookHandler,
  },
  {
    name: "storeb-webhook",
    method: "POST",
    pattern: "/v1/webhooks/storeb/:tenantId",
    auth: "store-b-push-token",
    handler: storebWebhookHandler,
  },
] as const satisfies readonly Endpoint[];

/** The name of an endpoint of {@linkcode ENDPOINTS}. */
export type EndpointName = typeof ENDPOINTS[number]["name"];

/** The routes of every endpoint, with handlers built from `deps`. */
export function apiRoutes(deps: ApiDeps): Route[] {
  return ENDPOINTS.map(({ name, method, pattern, handler }) => ({
    name,
    method,
    pattern,
    handler: handler(deps),
  }));
}
