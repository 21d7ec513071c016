package connect

import (
	"encoding/base64"
	"math"
	"math/big"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// This file writes JSON byte for byte as Kafka Connect's JsonConverter does
// (Jackson's UTF8JsonGenerator with default features) and numbers as Java's
// toString methods print them, so that encoded records equal Debezium's.

const hexUpper = "0123456789ABCDEF"

// AppendJSONString writes s as a JSON string the way Jackson does: only '"',
// '\\' and control characters are escaped, short forms for \b \t \n \f \r and
// \u00XX (upper-case hex) for the rest; a character beyond the Basic
// Multilingual Plane as its escaped surrogate pair (\uD83D\uDE00);
// everything else is raw UTF-8. Invalid UTF-8 becomes U+FFFD, as decoding into a Java String does.
func AppendJSONString(dst []byte, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\r':
				dst = append(dst, '\\', 'r')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexUpper[c>>4], hexUpper[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
			i++
			start = i
			continue
		}
		if r > 0xFFFF {
			// Jackson's UTF8JsonGenerator (Kafka Connect's JsonConverter)
			// writes a character beyond the Basic Multilingual Plane as
			// its UTF-16 surrogate pair escaped, not as its four UTF-8
			// bytes: in a key the bytes decide the partition.
			dst = append(dst, s[start:i]...)
			hi, lo := utf16.EncodeRune(r)
			dst = appendUEscape(dst, hi)
			dst = appendUEscape(dst, lo)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func appendUEscape(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', hexUpper[r>>12&0xF], hexUpper[r>>8&0xF], hexUpper[r>>4&0xF], hexUpper[r&0xF])
}

func AppendJSONStr(dst []byte, s string) []byte {
	return AppendJSONString(dst, []byte(s))
}

// AppendJavaDouble writes f as Java's Double.toString (bits 64) or
// Float.toString (bits 32) prints it (JDK 19 and later: the shortest decimal
// that rounds to f, at least two digits when one would do and two are
// closer).
func AppendJavaDouble(dst []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case f == 0:
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	var buf [32]byte
	s := strconv.AppendFloat(buf[:0], f, 'e', -1, bits)
	digits, exp := splitSci(s)
	if len(digits) == 1 {
		s2 := strconv.AppendFloat(buf[:0], f, 'e', 1, bits)
		d2, e2 := splitSci(s2)
		if len(d2) == 2 && d2[1] != '0' {
			digits, exp = d2, e2
		}
	}
	var db [24]byte
	digits = append(db[:0], digits...)
	if exp >= -3 && exp < 7 {
		if exp >= 0 {
			for len(digits) < exp+1 {
				digits = append(digits, '0')
			}
			dst = append(dst, digits[:exp+1]...)
			dst = append(dst, '.')
			if len(digits) > exp+1 {
				return append(dst, digits[exp+1:]...)
			}
			return append(dst, '0')
		}
		dst = append(dst, '0', '.')
		for i := 0; i < -exp-1; i++ {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	}
	dst = append(dst, digits[0], '.')
	if len(digits) > 1 {
		dst = append(dst, digits[1:]...)
	} else {
		dst = append(dst, '0')
	}
	dst = append(dst, 'E')
	return strconv.AppendInt(dst, int64(exp), 10)
}

// splitSci splits Go's "d.ddde±xx" into its digits and decimal exponent.
func splitSci(s []byte) ([]byte, int) {
	var digits []byte
	i := 0
	for ; i < len(s) && s[i] != 'e'; i++ {
		if s[i] != '.' {
			digits = append(digits, s[i])
		}
	}
	e, _ := strconv.Atoi(string(s[i+1:]))
	return digits, e
}

// AppendJSONDouble writes a double as Jackson does: Java's toString, and
// non-finite values quoted (QUOTE_NON_NUMERIC_NUMBERS is on by default).
func AppendJSONDouble(dst []byte, f float64, bits int) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		dst = append(dst, '"')
		dst = AppendJavaDouble(dst, f, bits)
		return append(dst, '"')
	}
	return AppendJavaDouble(dst, f, bits)
}

// Decimal is a java.math.BigDecimal: unscaled × 10^-scale.
type Decimal struct {
	Unscaled big.Int
	Scale    int32
}

var bigTen = big.NewInt(10)

// SetScale is BigDecimal.SetScale(scale) without rounding; false when digits
// would be lost (Java's ArithmeticException).
func (d *Decimal) SetScale(scale int32) bool {
	if scale == d.Scale {
		return true
	}
	if scale > d.Scale {
		f := new(big.Int).Exp(bigTen, big.NewInt(int64(scale-d.Scale)), nil)
		d.Unscaled.Mul(&d.Unscaled, f)
		d.Scale = scale
		return true
	}
	f := new(big.Int).Exp(bigTen, big.NewInt(int64(d.Scale-scale)), nil)
	q, r := new(big.Int).QuoRem(&d.Unscaled, f, new(big.Int))
	if r.Sign() != 0 {
		return false
	}
	d.Unscaled.Set(q)
	d.Scale = scale
	return true
}

// StripTrailingZeros is BigDecimal.StripTrailingZeros followed by
// setScale(0) when the scale went negative: trailing zeros come off the
// fraction only (12.50 is 12.5, 100 stays 100, 0.000 is 0).
func (d *Decimal) StripTrailingZeros() {
	var q, r big.Int
	for d.Scale > 0 {
		q.QuoRem(&d.Unscaled, bigTen, &r)
		if r.Sign() != 0 {
			break
		}
		d.Unscaled.Set(&q)
		d.Scale--
	}
}

// ParseDecimal parses PostgreSQL's numeric output ("-12.340").
func ParseDecimal(s []byte) (*Decimal, bool) {
	if len(s) == 0 {
		return nil, false
	}
	var digits []byte
	neg := false
	i := 0
	if s[0] == '-' || s[0] == '+' {
		neg = s[0] == '-'
		i++
	}
	scale := int32(-1)
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			digits = append(digits, c)
			if scale >= 0 {
				scale++
			}
		case c == '.' && scale < 0:
			scale = 0
		default:
			return nil, false
		}
	}
	if len(digits) == 0 {
		return nil, false
	}
	if scale < 0 {
		scale = 0
	}
	d := &Decimal{Scale: scale}
	d.Unscaled.SetString(string(digits), 10)
	if neg {
		d.Unscaled.Neg(&d.Unscaled)
	}
	return d, true
}

// AppendJavaBigDecimal writes d as BigDecimal.toString does.
func AppendJavaBigDecimal(dst []byte, d *Decimal) []byte {
	coeff := d.Unscaled.String()
	if coeff[0] == '-' {
		dst = append(dst, '-')
		coeff = coeff[1:]
	}
	adjusted := -int64(d.Scale) + int64(len(coeff)-1)
	if d.Scale >= 0 && adjusted >= -6 {
		sc := int(d.Scale)
		switch {
		case sc == 0:
			return append(dst, coeff...)
		case len(coeff) > sc:
			dst = append(dst, coeff[:len(coeff)-sc]...)
			dst = append(dst, '.')
			return append(dst, coeff[len(coeff)-sc:]...)
		default:
			dst = append(dst, '0', '.')
			for i := 0; i < sc-len(coeff); i++ {
				dst = append(dst, '0')
			}
			return append(dst, coeff...)
		}
	}
	dst = append(dst, coeff[0])
	if len(coeff) > 1 {
		dst = append(dst, '.')
		dst = append(dst, coeff[1:]...)
	}
	dst = append(dst, 'E')
	if adjusted >= 0 {
		dst = append(dst, '+')
	}
	return strconv.AppendInt(dst, adjusted, 10)
}

// TwosComplement is BigInteger.toByteArray: the shortest big-endian two's
// complement form, as Kafka Connect's Decimal logical type stores it.
func TwosComplement(x *big.Int) []byte {
	if x.Sign() >= 0 {
		b := x.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	y := new(big.Int).Neg(x)
	y.Sub(y, big.NewInt(1))
	b := y.Bytes()
	for i := range b {
		b[i] = ^b[i]
	}
	if len(b) == 0 || b[0]&0x80 == 0 {
		b = append([]byte{0xFF}, b...)
	}
	return b
}

func AppendBase64JSON(dst []byte, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}
