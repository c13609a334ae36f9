/** Being built: see the store gateway's issue. */
import type { Handler } from "../http/router.ts";
import type { StorebVerifyDeps } from "./storeb_verify.ts";

/** Answers its route; not built yet. */
export function storebConsumeHandler(_deps: StorebVerifyDeps): Handler {
  return () => {
    throw new Error("not built yet");
  };
}
