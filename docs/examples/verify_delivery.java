// Verifies a Purchase Relay delivery in your backend (Java 17+, standard library only).
//
// The service signs "<t>.<raw body>" with HMAC-SHA256 keyed with your webhook secret and sends
// "X-Service-Signature: t=<epoch seconds>,v1=<hex>". During a secret rotation the header
// carries two v1 values (new secret first); a delivery is genuine when any of them matches.
//
// Copy the class into your code as VerifyDelivery.java. Pass the body exactly as received
// (bytes), before any JSON parsing: re-serialising a parsed body changes its bytes and the
// signature no longer matches. In Spring, take the body as `@RequestBody byte[] body`:
//
//   var check = VerifyDelivery.check(secret, signatureHeader, body);
//   if (!check.valid()) {
//     log.warn("refused a delivery: {}", check.reason());
//     return ResponseEntity.status(401).build();
//   }
//
// Kotlin calls it the same way: VerifyDelivery.check(secret, header, body).valid
//
// Command line, for a quick check (exit status 0 when valid, 1 when not, 2 on wrong usage):
//   java verify_delivery.java SECRET SIGNATURE_HEADER BODY_FILE
// It prints "valid", or "invalid: <reason>".

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.regex.Pattern;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

public final class VerifyDelivery {
  // Why a delivery is refused, checked in this order.
  /** No X-Service-Signature header, or an empty one. */
  public static final String NO_HEADER = "no_header";
  /** No t, a t that is not a whole number of seconds, two t, or no v1 holding hex. */
  public static final String MALFORMED_HEADER = "malformed_header";
  /** t is further from now than the tolerance: a replay, or a clock out of sync. */
  public static final String TIMESTAMP_OUTSIDE_TOLERANCE = "timestamp_outside_tolerance";
  /** No v1 is the signature of this body with this secret (changed body, wrong secret). */
  public static final String NO_MATCHING_SIGNATURE = "no_matching_signature";

  /** How far t may be from now, in the past or the future. */
  public static final long DEFAULT_TOLERANCE_SECONDS = 300;

  private static final Pattern TIMESTAMP = Pattern.compile("[0-9]{1,15}");
  private static final Pattern HEX = Pattern.compile("(?:[0-9a-fA-F]{2})+");

  /** valid is true for a genuine delivery; otherwise reason says why it was refused. */
  public record DeliveryCheck(boolean valid, String reason) {}

  private VerifyDelivery() {}

  /** {@link #check(String, String, byte[], long, long)} with the clock and 300 seconds. */
  public static DeliveryCheck check(String secret, String signatureHeader, byte[] rawBody) {
    return check(
        secret,
        signatureHeader,
        rawBody,
        System.currentTimeMillis() / 1000,
        DEFAULT_TOLERANCE_SECONDS);
  }

  /**
   * Checks that signatureHeader (the X-Service-Signature value) holds a v1 signature of rawBody
   * made with secret, at a timestamp within toleranceSeconds of nowSeconds.
   */
  public static DeliveryCheck check(
      String secret,
      String signatureHeader,
      byte[] rawBody,
      long nowSeconds,
      long toleranceSeconds) {
    if (signatureHeader == null || signatureHeader.isEmpty()) return refused(NO_HEADER);
    String timestamp = null;
    List<byte[]> candidates = new ArrayList<>();
    for (String part : signatureHeader.split(",", -1)) {
      int separator = part.indexOf('=');
      if (separator < 0) continue;
      String key = part.substring(0, separator).trim();
      String value = part.substring(separator + 1).trim();
      if (key.equals("t")) {
        if (timestamp != null) return refused(MALFORMED_HEADER); // two timestamps: ambiguous
        timestamp = value;
      } else if (key.equals("v1") && HEX.matcher(value).matches()) {
        candidates.add(HexFormat.of().parseHex(value));
      } // other schemes are ignored, so a future v2 does not break this receiver
    }
    if (timestamp == null || !TIMESTAMP.matcher(timestamp).matches() || candidates.isEmpty()) {
      return refused(MALFORMED_HEADER);
    }
    if (Math.abs(nowSeconds - Long.parseLong(timestamp)) > toleranceSeconds) {
      return refused(TIMESTAMP_OUTSIDE_TOLERANCE);
    }

    byte[] expected = hmacSha256(secret, timestamp, rawBody);
    boolean matched = false;
    for (byte[] candidate : candidates) {
      // MessageDigest.isEqual takes constant time; every candidate is compared.
      matched = MessageDigest.isEqual(candidate, expected) || matched;
    }
    return matched ? new DeliveryCheck(true, null) : refused(NO_MATCHING_SIGNATURE);
  }

  /** check() as a boolean: true when the delivery is genuine. */
  public static boolean verify(String secret, String signatureHeader, byte[] rawBody) {
    return check(secret, signatureHeader, rawBody).valid();
  }

  private static byte[] hmacSha256(String secret, String timestamp, byte[] rawBody) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
      mac.update((timestamp + ".").getBytes(StandardCharsets.US_ASCII));
      return mac.doFinal(rawBody);
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("HmacSHA256 is not available", e);
    }
  }

  private static DeliveryCheck refused(String reason) {
    return new DeliveryCheck(false, reason);
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: java verify_delivery.java SECRET SIGNATURE_HEADER BODY_FILE");
      System.exit(2);
    }
    DeliveryCheck check = check(args[0], args[1], Files.readAllBytes(Path.of(args[2])));
    System.out.println(check.valid() ? "valid" : "invalid: " + check.reason());
    System.exit(check.valid() ? 0 : 1);
  }
}
