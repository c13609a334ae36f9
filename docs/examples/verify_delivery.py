"""Verifies a Purchase Relay delivery in your backend (Python 3, standard library only).

The service signs "<t>.<raw body>" with HMAC-SHA256 keyed with your webhook secret and sends
"X-Service-Signature: t=<epoch seconds>,v1=<hex>". During a secret rotation the header
carries two v1 values (new secret first); a delivery is genuine when any of them matches.

Copy verify_delivery() into your code. Pass the body exactly as received (bytes), before any
JSON parsing: re-serialising a parsed body changes its bytes and the signature no longer
matches. For example, in Flask: verify_delivery(secret,
request.headers.get("X-Service-Signature"), request.get_data()).

Command line, for a quick check (exit status 0 when valid, 1 when not, 2 on wrong usage):
    python3 verify_delivery.py SECRET SIGNATURE_HEADER BODY_FILE
"""

import hashlib
import hmac
import re
import sys
import time

_TIMESTAMP = re.compile(r"[0-9]{1,15}")


def verify_delivery(
    secret, signature_header, raw_body: bytes, tolerance_seconds=300, now=None
) -> bool:
    """True when signature_header holds a v1 signature of raw_body made with secret, at a
    timestamp within tolerance_seconds of now (epoch seconds; defaults to the clock)."""
    if not signature_header:
        return False
    timestamp = None
    candidates = []
    for part in signature_header.split(","):
        key, separator, value = part.partition("=")
        if not separator:
            continue
        key, value = key.strip(), value.strip()
        if key == "t":
            if timestamp is not None:
                return False  # two timestamps: ambiguous, refuse
            timestamp = value
        elif key == "v1" and value:
            candidates.append(value)
        # other schemes are ignored, so a future v2 does not break this receiver
    if timestamp is None or not _TIMESTAMP.fullmatch(timestamp) or not candidates:
        return False
    current = int(time.time()) if now is None else now
    if abs(current - int(timestamp)) > tolerance_seconds:
        return False

    message = timestamp.encode("ascii") + b"." + raw_body
    expected = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest().encode("ascii")
    matched = False
    for candidate in candidates:
        # compare_digest takes constant time; every candidate is compared.
        matched = hmac.compare_digest(candidate.lower().encode("utf-8"), expected) or matched
    return matched


def _main(argv):
    if len(argv) != 4:
        print("usage: verify_delivery.py SECRET SIGNATURE_HEADER BODY_FILE", file=sys.stderr)
        return 2
    secret, header, body_file = argv[1:]
    with open(body_file, "rb") as file:
        raw_body = file.read()
    valid = verify_delivery(secret, header, raw_body)
    print("valid" if valid else "invalid")
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
