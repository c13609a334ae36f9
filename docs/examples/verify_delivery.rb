# Verifies a Purchase Relay delivery in your backend (Ruby 2.7+, standard library only).
#
# The service signs "<t>.<raw body>" with HMAC-SHA256 keyed with your webhook secret and sends
# "X-Service-Signature: t=<epoch seconds>,v1=<hex>". During a secret rotation the header
# carries two v1 values (new secret first); a delivery is genuine when any of them matches.
#
# Copy the PurchaseRelay module into your code. Pass the body exactly as received, before any
# JSON parsing: re-serialising a parsed body changes its bytes and the signature no longer
# matches. In Rails:
#   check = PurchaseRelay.check_delivery(secret, request.headers["X-Service-Signature"],
#                                        request.raw_post)
#   unless check.valid
#     Rails.logger.warn("refused a delivery: #{check.reason}")
#     return head(:unauthorized)
#   end
#
# Command line, for a quick check (exit status 0 when valid, 1 when not, 2 on wrong usage):
#   ruby verify_delivery.rb SECRET SIGNATURE_HEADER BODY_FILE
# It prints "valid", or "invalid: <reason>".

require "openssl"

module PurchaseRelay
  # Why a delivery is refused, checked in this order.
  NO_HEADER = "no_header" # no X-Service-Signature, or an empty one
  MALFORMED_HEADER = "malformed_header" # no t, a t that is not whole seconds, two t, no hex v1
  TIMESTAMP_OUTSIDE_TOLERANCE = "timestamp_outside_tolerance" # a replay, or a clock out of sync
  NO_MATCHING_SIGNATURE = "no_matching_signature" # changed body, wrong secret, re-serialised body

  # valid is true for a genuine delivery; otherwise reason says why it was refused.
  DeliveryCheck = Struct.new(:valid, :reason)

  # Checks that signature_header holds a v1 signature of raw_body made with secret, at a
  # timestamp within tolerance_seconds of now (epoch seconds), in the past or the future.
  def self.check_delivery(secret, signature_header, raw_body, tolerance_seconds: 300, now: Time.now.to_i)
    return refused(NO_HEADER) if signature_header.nil? || signature_header.empty?

    timestamp = nil
    candidates = []
    signature_header.split(",").each do |part|
      key, separator, value = part.partition("=")
      next if separator.empty?

      key = key.strip
      value = value.strip
      if key == "t"
        return refused(MALFORMED_HEADER) unless timestamp.nil? # two timestamps: ambiguous

        timestamp = value
      elsif key == "v1" && value.match?(/\A(?:[0-9a-fA-F]{2})+\z/)
        candidates << value.downcase
      end
      # other schemes are ignored, so a future v2 does not break this receiver
    end
    return refused(MALFORMED_HEADER) if timestamp.nil? || !timestamp.match?(/\A[0-9]{1,15}\z/) || candidates.empty?
    return refused(TIMESTAMP_OUTSIDE_TOLERANCE) if (now - timestamp.to_i).abs > tolerance_seconds

    expected = OpenSSL::HMAC.hexdigest("SHA256", secret, "#{timestamp}.#{raw_body.b}")
    matched = false
    candidates.each do |candidate|
      # secure_compare takes constant time; every candidate is compared.
      matched = secure_compare(candidate, expected) || matched
    end
    matched ? DeliveryCheck.new(true, nil) : refused(NO_MATCHING_SIGNATURE)
  end

  # check_delivery as a boolean: true when the delivery is genuine.
  def self.verify_delivery(secret, signature_header, raw_body, **options)
    check_delivery(secret, signature_header, raw_body, **options).valid
  end

  def self.refused(reason)
    DeliveryCheck.new(false, reason)
  end

  # Compares without returning early, so timing does not reveal how many bytes matched (the
  # same as OpenSSL.secure_compare of openssl 2.2 and later).
  def self.secure_compare(a, b)
    return false unless a.bytesize == b.bytesize

    difference = 0
    a.bytes.zip(b.bytes) { |x, y| difference |= x ^ y }
    difference.zero?
  end
  private_class_method :refused, :secure_compare
end

if $PROGRAM_NAME == __FILE__
  if ARGV.length != 3
    warn "usage: verify_delivery.rb SECRET SIGNATURE_HEADER BODY_FILE"
    exit 2
  end
  secret, header, body_file = ARGV
  check = PurchaseRelay.check_delivery(secret, header, File.binread(body_file))
  puts(check.valid ? "valid" : "invalid: #{check.reason}")
  exit(check.valid ? 0 : 1)
end
