<?php
// Verifies a Purchase Relay delivery in your backend (PHP 7.4+, no extension beyond the
// default hash extension).
//
// The service signs "<t>.<raw body>" with HMAC-SHA256 keyed with your webhook secret and sends
// "X-Service-Signature: t=<epoch seconds>,v1=<hex>". During a secret rotation the header
// carries two v1 values (new secret first); a delivery is genuine when any of them matches.
//
// Copy purchase_relay_check_delivery() into your code. Pass the body exactly as received,
// before any JSON decoding: re-encoding a decoded body changes its bytes and the signature no
// longer matches. In plain PHP:
//
//   $check = purchase_relay_check_delivery(
//       $secret, $_SERVER['HTTP_X_SERVICE_SIGNATURE'] ?? null, file_get_contents('php://input'));
//   if (!$check['valid']) {
//       error_log('refused a delivery: ' . $check['reason']);
//       http_response_code(401);
//       exit;
//   }
//
// In Laravel: $request->header('X-Service-Signature') and $request->getContent().
//
// Command line, for a quick check (exit status 0 when valid, 1 when not, 2 on wrong usage):
//   php verify_delivery.php SECRET SIGNATURE_HEADER BODY_FILE
// It prints "valid", or "invalid: <reason>".

// Why a delivery is refused, checked in this order.
const PURCHASE_RELAY_NO_HEADER = 'no_header'; // no X-Service-Signature, or an empty one
const PURCHASE_RELAY_MALFORMED_HEADER = 'malformed_header'; // no t, t not whole seconds, two t, no hex v1
const PURCHASE_RELAY_TIMESTAMP_OUTSIDE_TOLERANCE = 'timestamp_outside_tolerance'; // replay, or clock off
const PURCHASE_RELAY_NO_MATCHING_SIGNATURE = 'no_matching_signature'; // changed body, wrong secret

/**
 * Checks that $signatureHeader (the X-Service-Signature value) holds a v1 signature of $rawBody
 * made with $secret, at a timestamp within $toleranceSeconds of $now (epoch seconds; the clock
 * when null), in the past or the future.
 *
 * @return array{valid: bool, reason: ?string} reason says why an invalid delivery was refused.
 *   Test $check['valid']: the array itself is always truthy.
 */
function purchase_relay_check_delivery(
    string $secret,
    ?string $signatureHeader,
    string $rawBody,
    int $toleranceSeconds = 300,
    ?int $now = null
): array {
    if ($signatureHeader === null || $signatureHeader === '') {
        return ['valid' => false, 'reason' => PURCHASE_RELAY_NO_HEADER];
    }
    $timestamp = null;
    $candidates = [];
    foreach (explode(',', $signatureHeader) as $part) {
        $separator = strpos($part, '=');
        if ($separator === false) {
            continue;
        }
        $key = trim(substr($part, 0, $separator));
        $value = trim(substr($part, $separator + 1));
        if ($key === 't') {
            if ($timestamp !== null) { // two timestamps: ambiguous
                return ['valid' => false, 'reason' => PURCHASE_RELAY_MALFORMED_HEADER];
            }
            $timestamp = $value;
        } elseif ($key === 'v1' && preg_match('/\A(?:[0-9a-fA-F]{2})+\z/', $value) === 1) {
            $candidates[] = strtolower($value);
        } // other schemes are ignored, so a future v2 does not break this receiver
    }
    if ($timestamp === null || preg_match('/\A[0-9]{1,15}\z/', $timestamp) !== 1 || !$candidates) {
        return ['valid' => false, 'reason' => PURCHASE_RELAY_MALFORMED_HEADER];
    }
    $now = $now ?? time();
    if (abs($now - (int) $timestamp) > $toleranceSeconds) {
        return ['valid' => false, 'reason' => PURCHASE_RELAY_TIMESTAMP_OUTSIDE_TOLERANCE];
    }

    $expected = hash_hmac('sha256', $timestamp . '.' . $rawBody, $secret);
    $matched = false;
    foreach ($candidates as $candidate) {
        // hash_equals takes constant time; every candidate is compared.
        $matched = hash_equals($expected, $candidate) || $matched;
    }
    return $matched
        ? ['valid' => true, 'reason' => null]
        : ['valid' => false, 'reason' => PURCHASE_RELAY_NO_MATCHING_SIGNATURE];
}

/** purchase_relay_check_delivery() as a boolean: true when the delivery is genuine. */
function purchase_relay_verify_delivery(string $secret, ?string $signatureHeader, string $rawBody): bool
{
    return purchase_relay_check_delivery($secret, $signatureHeader, $rawBody)['valid'];
}

if (PHP_SAPI === 'cli' && realpath($_SERVER['SCRIPT_FILENAME'] ?? '') === __FILE__) {
    if ($argc !== 4) {
        fwrite(STDERR, "usage: php verify_delivery.php SECRET SIGNATURE_HEADER BODY_FILE\n");
        exit(2);
    }
    $check = purchase_relay_check_delivery($argv[1], $argv[2], file_get_contents($argv[3]));
    echo $check['valid'] ? "valid\n" : "invalid: {$check['reason']}\n";
    exit($check['valid'] ? 0 : 1);
}
