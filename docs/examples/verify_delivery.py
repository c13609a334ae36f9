"""Verifies a Purchase Relay delivery in your backend (Python 3, standard library only).

The service signs "<t>.<raw body>" with HMAC-SHA256 keyed with your webhook secret and sends
"X-Service-Signature: t=<epoch seconds>,v1=<hex>". During a secret rotation the header
carries two v1 values (new secret first); a delivery is genuine when any of them matches.

Copy check_delivery() (or verify_delivery(), its boolean form) into your code. Pass the body
exactly as received (bytes), before any JSON parsing: re-serialising a parsed body changes its
bytes and the signature no longer matches. For example, in Flask:
    check = check_delivery(secret, request.headers.get("X-Service-Signature"), request.get_data())
    if not check.valid:
        app.logger.warning("refused a delivery: %s", check.reason)
        abort(401)

Command line, for a quick check (exit status 0 when valid, 1 when not, 2 on wrong usage):
    python3 verify_delivery.py SECRET SIGNATURE_HEADER BODY_FILE
It prints "valid", or "invalid: <reason>".
"""

import hashlib
import hmac
import re
import sys
import time
from typing import NamedTuple, Optional

_TIMESTAMP = re.compile(r"[0-9]{1,15}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")

# Why a delivery is refused, checked in this order.
NO_HEADER = "no_header"  # no X-Service-Signature, or an empty one
MALFORMED_HEADER = "malformed_header"  # no t, a t that is not whole seconds, two t, no hex v1
TIMESTAMP_OUTSIDE_TOLERANCE = "timestamp_outside_tolerance"  # a replay, or a clock out of sync
NO_MATCHING_SIGNATURE = "no_matching_signature"  # changed body, wrong secret, re-serialised body


class DeliveryCheck(NamedTuple):
    """valid is True for a genuine delivery; otherwise reason says why it was refused."""

    valid: bool
    reason: Optional[str]


def check_delivery(
    secret, signature_header, raw_body: bytes, tolerance_seconds=300, now=None
) -> DeliveryCheck:
    """Checks that signature_header holds a v1 signature of raw_body made with secret, at a
    timestamp within tolerance_seconds of now (epoch seconds; defaults to the clock), in the
    past or the future. Read .valid: the result itself is a tuple, always truthy."""
    if not signature_header:
        return DeliveryCheck(False, NO_HEADER)
    timestamp = None
    candidates = []
    for part in signature_header.split(","):
        key, separator, value = part.partition("=")
        if not separator:
            continue
        key, value = key.strip(), value.strip()
        if key == "t":
            if timestamp is not None:
                return DeliveryCheck(False, MALFORMED_HEADER)  # two timestamps: ambiguous
            timestamp = value
        elif key == "v1" and _HEX.fullmatch(value):
            candidates.append(value.lower())
        # other schemes are ignored, so a future v2 does not break this receiver
    if timestamp is None or not _TIMESTAMP.fullmatch(timestamp) or not candidates:
        return DeliveryCheck(False, MALFORMED_HEADER)
    current = int(time.time()) if now is None else now
    if abs(current - int(timestamp)) > tolerance_seconds:
        return DeliveryCheck(False, TIMESTAMP_OUTSIDE_TOLERANCE)

    message = timestamp.encode("ascii") + b"." + raw_body
    expected = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
    matched = False
    for candidate in candidates:
        # compare_digest takes constant time; every candidate is compared.
        matched = hmac.compare_digest(candidate, expected) or matched
    return DeliveryCheck(True, None) if matched else DeliveryCheck(False, NO_MATCHING_SIGNATURE)


def verify_delivery(
    secret, signature_header, raw_body: bytes, tolerance_seconds=300, now=None
) -> bool:
    """check_delivery() as a boolean: True when the delivery is genuine."""
    return check_delivery(secret, signature_header, raw_body, tolerance_seconds, now).valid


def _main(argv):
    if len(argv) != 4:
        print("usage: verify_delivery.py SECRET SIGNATURE_HEADER BODY_FILE", file=sys.stderr)
        return 2
    secret, header, body_file = argv[1:]
    with open(body_file, "rb") as file:
        raw_body = file.read()
    check = check_delivery(secret, header, raw_body)
    print("valid" if check.valid else f"invalid: {check.reason}")
    return 0 if check.valid else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
