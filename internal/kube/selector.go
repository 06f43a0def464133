package kube

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Selector chooses pods by their labels, in the syntax of kubectl's --selector: a
// comma-separated list of requirements that must all hold.
//
//	key            the label exists        !key            it does not
//	key=value      key==value              key!=value      (!= also holds without the label)
//	key in (a,b)   key notin (a,b)         (notin also holds without the label)
//	key>3          key<3                   (the value is an integer greater or less)
type Selector struct {
	reqs []requirement
}

type operator int

const (
	opExists operator = iota
	opNotExists
	opIn // = and == are in with one value
	opNotIn
	opGreater
	opLess
)

type requirement struct {
	key    string
	op     operator
	values []string
	n      int64 // the bound of > and <
}

var (
	// A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63
	// characters, alphanumeric at both ends.
	labelName   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefix = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func validKey(k string) error {
	name := k
	if prefix, n, ok := strings.Cut(k, "/"); ok {
		if len(prefix) == 0 || len(prefix) > 253 || !labelPrefix.MatchString(prefix) {
			return fmt.Errorf("label key %q: the prefix must be a DNS subdomain", k)
		}
		name = n
	}
	if !labelName.MatchString(name) {
		return fmt.Errorf("label key %q: want at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", k)
	}
	return nil
}

func validValue(v string) error {
	if v != "" && !labelName.MatchString(v) {
		return fmt.Errorf("label value %q: want at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", v)
	}
	return nil
}

// ParseSelector parses a label selector. An empty one chooses every pod.
func ParseSelector(s string) (*Selector, error) {
	sel := &Selector{}
	for _, part := range splitRequirements(s) {
		part = strings.TrimSpace(part)
		if part == "" {
			if strings.TrimSpace(s) == "" {
				continue
			}
			return nil, fmt.Errorf("selector %q: an empty requirement", s)
		}
		r, err := parseRequirement(part)
		if err != nil {
			return nil, fmt.Errorf("selector %q: %w", s, err)
		}
		sel.reqs = append(sel.reqs, r)
	}
	return sel, nil
}

// splitRequirements splits at the commas outside parentheses.
func splitRequirements(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// setRequirement splits "key in (...)" and "key notin (...)".
func setRequirement(p string) (key string, op operator, rest string, ok bool) {
	i := strings.IndexAny(p, " \t(")
	if i <= 0 || strings.ContainsAny(p[:i], "=!<>") {
		return "", 0, "", false
	}
	key, rest = p[:i], strings.TrimSpace(p[i:])
	for _, w := range []struct {
		word string
		op   operator
	}{{"notin", opNotIn}, {"in", opIn}} {
		if r, found := strings.CutPrefix(rest, w.word); found && (strings.HasPrefix(r, "(") || strings.HasPrefix(r, " ") || strings.HasPrefix(r, "\t")) {
			return key, w.op, r, true
		}
	}
	return "", 0, "", false
}

func parseRequirement(p string) (requirement, error) {
	if k, ok := strings.CutPrefix(p, "!"); ok {
		k = strings.TrimSpace(k)
		return requirement{key: k, op: opNotExists}, validKey(k)
	}
	// Set-based: key in (...), key notin (...).
	if key, op, rest, ok := setRequirement(p); ok {
		if err := validKey(key); err != nil {
			return requirement{}, err
		}
		rest = strings.TrimSpace(rest)
		if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
			return requirement{}, fmt.Errorf("%q: want the values in parentheses", p)
		}
		var values []string
		for _, v := range strings.Split(rest[1:len(rest)-1], ",") {
			v = strings.TrimSpace(v)
			if err := validValue(v); err != nil {
				return requirement{}, err
			}
			values = append(values, v)
		}
		return requirement{key: key, op: op, values: values}, nil
	}
	for _, o := range []struct {
		tok string
		op  operator
	}{{"==", opIn}, {"!=", opNotIn}, {"=", opIn}, {">", opGreater}, {"<", opLess}} {
		key, value, ok := strings.Cut(p, o.tok)
		if !ok {
			continue
		}
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if err := validKey(key); err != nil {
			return requirement{}, err
		}
		r := requirement{key: key, op: o.op, values: []string{value}}
		if o.op == opGreater || o.op == opLess {
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return requirement{}, fmt.Errorf("%q: want an integer after %s", p, o.tok)
			}
			r.n = n
		} else if err := validValue(value); err != nil {
			return requirement{}, err
		}
		return r, nil
	}
	if strings.ContainsAny(p, " \t()") {
		return requirement{}, fmt.Errorf("%q: not a requirement", p)
	}
	return requirement{key: p, op: opExists}, validKey(p)
}

// Matches reports whether labels meet every requirement.
func (s *Selector) Matches(labels map[string]string) bool {
	for _, r := range s.reqs {
		v, has := labels[r.key]
		var ok bool
		switch r.op {
		case opExists:
			ok = has
		case opNotExists:
			ok = !has
		case opIn:
			ok = has && slices.Contains(r.values, v)
		case opNotIn:
			ok = !has || !slices.Contains(r.values, v)
		case opGreater, opLess:
			n, err := strconv.ParseInt(v, 10, 64)
			ok = has && err == nil && (r.op == opGreater && n > r.n || r.op == opLess && n < r.n)
		}
		if !ok {
			return false
		}
	}
	return true
}
