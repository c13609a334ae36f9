// Verifies a Purchase Relay delivery in your backend (Go 1.19+, standard library only).
//
// The service signs "<t>.<raw body>" with HMAC-SHA256 keyed with your webhook secret and sends
// "X-Service-Signature: t=<epoch seconds>,v1=<hex>". During a secret rotation the header
// carries two v1 values (new secret first); a delivery is genuine when any of them matches.
//
// Copy VerifyDelivery and its errors into your code. Pass the body exactly as received, before
// any JSON decoding: re-encoding a decoded body changes its bytes and the signature no longer
// matches. With net/http:
//
//	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
//	if err != nil { ... }
//	if err := VerifyDelivery(secret, r.Header.Get("X-Service-Signature"), body, time.Now(), 0); err != nil {
//		log.Printf("refused a delivery: %v", err)
//		http.Error(w, "invalid signature", http.StatusUnauthorized)
//		return
//	}
//
// Command line, for a quick check (exit status 0 when valid, 1 when not, 2 on wrong usage):
//
//	go run verify_delivery.go SECRET SIGNATURE_HEADER BODY_FILE
//
// It prints "valid", or "invalid: <reason>".
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Why a delivery is refused, checked in this order. Compare with errors.Is.
var (
	// No X-Service-Signature header, or an empty one.
	ErrNoHeader = errors.New("no_header")
	// No t, a t that is not a whole number of seconds, two t, or no v1 holding hex.
	ErrMalformedHeader = errors.New("malformed_header")
	// t is further from now than the tolerance: a replay, or a clock out of sync.
	ErrTimestampOutsideTolerance = errors.New("timestamp_outside_tolerance")
	// No v1 is the signature of this body with this secret: a changed body, a wrong secret,
	// or a body that was decoded and encoded again.
	ErrNoMatchingSignature = errors.New("no_matching_signature")
)

// DefaultTolerance is how far t may be from now, in the past or the future.
const DefaultTolerance = 300 * time.Second

var timestampPattern = regexp.MustCompile(`^[0-9]{1,15}$`)

// VerifyDelivery returns nil when header (the X-Service-Signature value) holds a v1 signature
// of body made with secret, at a timestamp within tolerance of now (DefaultTolerance when
// tolerance is 0); otherwise one of the errors above, saying why.
func VerifyDelivery(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return ErrNoHeader
	}
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	timestamp := ""
	seenTimestamp := false
	var candidates [][]byte
	for _, part := range strings.Split(header, ",") {
		key, value, found := strings.Cut(part, "=")
		if !found {
			continue
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch key {
		case "t":
			if seenTimestamp {
				return ErrMalformedHeader // two timestamps: ambiguous
			}
			seenTimestamp = true
			timestamp = value
		case "v1":
			if decoded, err := hex.DecodeString(value); err == nil && len(decoded) > 0 {
				candidates = append(candidates, decoded)
			}
		} // other schemes are ignored, so a future v2 does not break this receiver
	}
	if !timestampPattern.MatchString(timestamp) || len(candidates) == 0 {
		return ErrMalformedHeader
	}
	seconds, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return ErrMalformedHeader
	}
	age := now.Unix() - seconds
	if age < 0 {
		age = -age
	}
	if age > int64(tolerance/time.Second) {
		return ErrTimestampOutsideTolerance
	}

	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp + "."))
	mac.Write(body)
	expected := mac.Sum(nil)
	matched := false
	for _, candidate := range candidates {
		// hmac.Equal takes constant time; every candidate is compared.
		matched = hmac.Equal(candidate, expected) || matched
	}
	if !matched {
		return ErrNoMatchingSignature
	}
	return nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: verify_delivery SECRET SIGNATURE_HEADER BODY_FILE")
		os.Exit(2)
	}
	body, err := os.ReadFile(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := VerifyDelivery(os.Args[1], os.Args[2], body, time.Now(), 0); err != nil {
		fmt.Printf("invalid: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("valid")
}
