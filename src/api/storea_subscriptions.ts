/** Being built: see the store gateway's issue. */
import type { Handler } from "../http/router.ts";
import type { StoreaVerifyDeps } from "./storea_verify.ts";

/** Answers its route; not built yet. */
export function storeaSubscriptionsHandler(_deps: StoreaVerifyDeps): Handler {
  return () => {
    throw new Error("not built yet");
  };
}
