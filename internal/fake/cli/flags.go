package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// kind is what a flag takes.
type kind int

const (
	boolFlag     kind = iota
	stringFlag        // a value, repeatable (the last one counts where one is meant)
	intFlag           // a whole number
	durationFlag      // a Go duration (5s, 2m)
	optFlag           // a value after '=' only; alone it means noOpt
)

// flag is one flag of a command, as spf13/pflag (which both real clients
// use) defines it: a long name, an optional one-letter shorthand.
type flag struct {
	long, short string
	kind        kind
	noOpt       string // optFlag: the value of the flag given alone
}

// parsed is a command line read against its flags.
type parsed struct {
	values map[string][]string // by long name, as given
	args   []string            // the positional arguments
	// dash is how many positional arguments came before "--" (-1: none
	// did), as cobra's ArgsLenAtDash.
	dash int
}

func (p parsed) has(long string) bool { return len(p.values[long]) > 0 }

// str is the last value of a flag ("" when not given).
func (p parsed) str(long string) string {
	v := p.values[long]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// boolean is a bool flag's value (def when not given); its syntax was
// checked by parse.
func (p parsed) boolean(long string, def bool) bool {
	if !p.has(long) {
		return def
	}
	b, _ := strconv.ParseBool(p.str(long))
	return b
}

// parse reads argv as pflag does: flags anywhere (interspersed) or, when
// not interspersed, only before the first positional argument; "--" ends
// the flags; --name=value, --name value, -n value, -nvalue, -n=value and
// clusters of bool shorthands (-it). Its errors are pflag's words.
func parse(flags []flag, argv []string, interspersed bool) (parsed, error) {
	p := parsed{values: map[string][]string{}, dash: -1}
	byLong, byShort := map[string]flag{}, map[string]flag{}
	for _, f := range flags {
		byLong[f.long] = f
		if f.short != "" {
			byShort[f.short] = f
		}
	}
	set := func(f flag, v string, shown string) error {
		switch f.kind {
		case boolFlag:
			if _, err := strconv.ParseBool(v); err != nil {
				return fmt.Errorf("invalid argument %q for %q flag: %v", v, shown, err)
			}
		case intFlag:
			if _, err := strconv.ParseInt(v, 0, 64); err != nil {
				return fmt.Errorf("invalid argument %q for %q flag: %v", v, shown, err)
			}
		case durationFlag:
			if _, err := time.ParseDuration(v); err != nil {
				return fmt.Errorf("invalid argument %q for %q flag: %v", v, shown, err)
			}
		}
		p.values[f.long] = append(p.values[f.long], v)
		return nil
	}
	shownName := func(f flag) string {
		if f.short != "" {
			return "-" + f.short + ", --" + f.long
		}
		return "--" + f.long
	}
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		switch {
		case a == "--":
			p.dash = len(p.args)
			p.args = append(p.args, argv[i+1:]...)
			return p, nil
		case len(a) < 2 || a[0] != '-':
			p.args = append(p.args, a)
			if !interspersed {
				p.args = append(p.args, argv[i+1:]...)
				return p, nil
			}
		case strings.HasPrefix(a, "--"):
			name, value, hasValue := strings.Cut(a[2:], "=")
			if name == "" || name[0] == '-' || name[0] == '=' {
				return p, fmt.Errorf("bad flag syntax: %s", a)
			}
			f, ok := byLong[name]
			if !ok {
				return p, fmt.Errorf("unknown flag: --%s", name)
			}
			switch {
			case hasValue:
			case f.kind == boolFlag:
				value = "true"
			case f.kind == optFlag:
				value = f.noOpt
			case i+1 < len(argv):
				i++
				value = argv[i]
			default:
				return p, fmt.Errorf("flag needs an argument: --%s", name)
			}
			if err := set(f, value, shownName(f)); err != nil {
				return p, err
			}
		default:
			shorts := a[1:]
			for len(shorts) > 0 {
				c := shorts[:1]
				f, ok := byShort[c]
				if !ok {
					return p, fmt.Errorf("unknown shorthand flag: %q in -%s", c[0], shorts)
				}
				var value string
				switch {
				case len(shorts) > 2 && shorts[1] == '=':
					value, shorts = shorts[2:], ""
				case f.kind == boolFlag:
					value, shorts = "true", shorts[1:]
				case f.kind == optFlag:
					value, shorts = f.noOpt, shorts[1:]
				case len(shorts) > 1:
					value, shorts = shorts[1:], ""
				case i+1 < len(argv):
					i++
					value, shorts = argv[i], ""
				default:
					return p, fmt.Errorf("flag needs an argument: %q in -%s", c[0], shorts)
				}
				if err := set(f, value, shownName(f)); err != nil {
					return p, err
				}
			}
		}
	}
	return p, nil
}
