// Package bytesize reads and writes byte sizes in the one syntax that the
// command line (xseg replay --capacity), the benchmarks' flags and the
// environment (XSEG_HOST_CAPACITY) share: a number with an optional unit,
// as github.com/dustin/go-humanize reads it.
//
//	1000000    plain bytes
//	512MiB     KiB, MiB, GiB, TiB (and Ki, Mi, Gi, Ti): powers of 1024
//	1.5GB      KB, MB, GB, TB (and K, M, G, T): powers of 1000
//
// Units are case-insensitive and may follow a space. humanize does the
// reading and the writing; this package adds what it lets through (a
// leading sign, an empty string), error texts that say what is wanted
// without repeating the value (the caller names the flag or variable and
// the value), and the check of a multiple of a page with a hint at the
// unit that was probably meant.
package bytesize

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// Syntax says what a size looks like, for error texts and help.
const Syntax = "a number of bytes with an optional unit, e.g. 24GiB, 512MiB or 1000000"

// ErrSyntax is the cause of every error of Parse.
var ErrSyntax = errors.New("not a byte size")

// Parse reads a size such as 24GiB, 512 MiB, 1.5TB or 1000000. A sign, a
// number too large for 64 bits, an unknown unit or a size that is not a
// whole number of bytes (2097152.9, 1.0000000001GiB) is an error that
// wraps ErrSyntax.
func Parse(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return 0, fmt.Errorf("%w: empty (want %s)", ErrSyntax, Syntax)
	case t[0] == '-':
		return 0, fmt.Errorf("%w: negative", ErrSyntax)
	case t[0] < '0' || t[0] > '9':
		// humanize reads no sign and no leading dot; say so before it
		// answers with strconv's words.
		return 0, fmt.Errorf("%w (want %s)", ErrSyntax, Syntax)
	}
	n, err := humanize.ParseBytes(t)
	if err != nil {
		if strings.HasPrefix(err.Error(), "too large") {
			return 0, tooLarge()
		}
		return 0, fmt.Errorf("%w (want %s)", ErrSyntax, Syntax)
	}
	if !strings.Contains(t, ".") {
		return n, nil // humanize reads whole numbers exactly
	}
	return whole(t)
}

func tooLarge() error { return fmt.Errorf("%w: larger than %s", ErrSyntax, Format(1<<64-1)) }

// whole is the size t, a number with a fraction that humanize.ParseBytes
// has accepted, if it is a whole number of bytes. ParseBytes multiplies
// such a number by its unit in float64 and truncates: 2097152.9 would be
// 2097152, 1.0000000001GiB 1GiB, and 4.35MB 4349999. whole multiplies
// exactly instead: t's number (read by big.Rat) times t's unit (humanize's
// ParseBigBytes of 1 of it).
func whole(t string) (uint64, error) {
	// humanize's number is the leading digits, dots and commas.
	end := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' && r != ',' })
	if end < 0 {
		end = len(t)
	}
	num, ok := new(big.Rat).SetString(strings.ReplaceAll(t[:end], ",", ""))
	unit, err := humanize.ParseBigBytes("1" + t[end:])
	if !ok || err != nil {
		return 0, fmt.Errorf("%w (want %s)", ErrSyntax, Syntax)
	}
	size := num.Mul(num, new(big.Rat).SetInt(unit))
	floor := new(big.Int).Quo(size.Num(), size.Denom())
	switch {
	case !floor.IsUint64():
		return 0, tooLarge()
	case !size.IsInt():
		return 0, fmt.Errorf("%w: not a whole number of bytes: between %d and %s",
			ErrSyntax, floor.Uint64(), new(big.Int).Add(floor, big.NewInt(1)))
	}
	return floor.Uint64(), nil
}

// Format writes n with a binary unit and up to four significant digits,
// without trailing zeros: 2 MiB, 14.69 GiB, 141 GiB, 24 B.
func Format(n uint64) string {
	s := humanize.IBytesN(n, 4)
	num, unit, ok := strings.Cut(s, " ")
	if !ok || !strings.Contains(num, ".") {
		return s
	}
	num = strings.TrimRight(strings.TrimRight(num, "0"), ".")
	return num + " " + unit
}

// FormatFixed writes n with a binary unit and exactly decimals decimals
// (bytes under 1 KiB as a whole number), for columns whose numbers should
// read alike: 6.775 GiB beside 7.080 GiB, where Format would give 7.08 GiB.
func FormatFixed(n uint64, decimals int) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	k, v := 0, float64(n)
	for v >= 1024 && k < len(units)-1 {
		v /= 1024
		k++
	}
	return strconv.FormatFloat(v, 'f', decimals, 64) + " " + units[k]
}

// ParseMultiple reads s as Parse does and checks that it is a positive
// multiple of unit, which what names ("the granularity"); a size that is
// not is an error that does not wrap ErrSyntax. A plain number smaller than
// unit gets a hint at the unit probably meant:
//
//	24 bytes is not a multiple of the granularity 2 MiB; did you mean 24GiB?
func ParseMultiple(s string, unit uint64, what string) (uint64, error) {
	n, err := Parse(s)
	if err != nil {
		return 0, err
	}
	if n != 0 && n%unit == 0 {
		return n, nil
	}
	msg := fmt.Sprintf("%s is not a multiple of %s %s", plural(n), what, Format(unit))
	if n == 0 {
		msg = fmt.Sprintf("want a positive multiple of %s %s", what, Format(unit))
	}
	if hint, ok := unitHint(s, unit); ok {
		msg += "; did you mean " + hint + "?"
	}
	return 0, errors.New(msg)
}

// unitHint suggests a size that is a multiple of unit for s: for a plain
// whole number smaller than unit, s in GiB, else in MiB; for a whole number
// of decimal units (24GB: 10^9 bytes each), the binary unit of the same
// letter (24GiB), with a word on the difference.
func unitHint(s string, unit uint64) (string, bool) {
	t := strings.TrimSpace(s)
	if hint, ok := decimalHint(t, unit); ok {
		return hint, true
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || n == 0 || n >= unit {
		return "", false
	}
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}} {
		if n < 1<<(64-u.shift) && (n<<u.shift)%unit == 0 {
			return t + u.name, true
		}
	}
	return "", false
}

// decimalHint: t is a whole number of kB, MB, GB or TB (any case, a space
// allowed) whose binary counterpart is a multiple of unit.
func decimalHint(t string, unit uint64) (string, bool) {
	for _, u := range []struct {
		dec, bin string
		shift    uint
	}{{"KB", "KiB", 10}, {"MB", "MiB", 20}, {"GB", "GiB", 30}, {"TB", "TiB", 40}} {
		if len(t) <= 2 || !strings.EqualFold(t[len(t)-2:], u.dec) {
			continue
		}
		num := strings.TrimSpace(t[:len(t)-2])
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil || n == 0 || n >= 1<<(64-u.shift) || (n<<u.shift)%unit != 0 {
			return "", false
		}
		return fmt.Sprintf("%s%s (%s is 10^%d bytes, %s 2^%d)", num, u.bin, u.dec, u.shift/10*3, u.bin, u.shift), true
	}
	return "", false
}

func plural(n uint64) string {
	if n == 1 {
		return "1 byte"
	}
	return strconv.FormatUint(n, 10) + " bytes"
}

// Flag is a flag value (flag.Value and pflag.Value) of a byte size; its
// zero value prints as 0 B.
type Flag uint64

// String prints the size as Format does.
func (f *Flag) String() string { return Format(uint64(*f)) }

// Set reads s as Parse does.
func (f *Flag) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*f = Flag(n)
	return nil
}

// Type names the values in pflag's help text.
func (f *Flag) Type() string { return "SIZE" }
