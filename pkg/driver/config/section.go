package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DecodeSection is the one reader of a section: the settings of a
// backend or an adapter, a mapping of the file as YAML decoded it. It
// reads section into out, a pointer to the struct the backend or adapter
// takes (its Options), whose json tags name the keys the section takes:
// a field without a json name, or tagged "-", is no key; an embedded
// struct adds its keys. Keys are matched exactly. A key the struct has no
// field for is an error naming the key and the section (at, e.g.
// "backends.docker"), and so is a value of the wrong type; a
// time.Duration takes a string like "30s" (not negative); null leaves a
// field as it is. A nil or empty section changes nothing.
func DecodeSection(section map[string]any, out any, at string) error {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("cannot read %s into %T: want a pointer to a struct", at, out)
	}
	keys := sectionKeys(v.Elem().Type())
	for _, key := range slices.Sorted(maps.Keys(section)) {
		index, ok := keys[key]
		if !ok {
			return fmt.Errorf("%s.%s: unknown key (%s takes %s)", at, key, at, keyList(keys))
		}
		if err := decodeValue(section[key], v.Elem().FieldByIndex(index)); err != nil {
			return fmt.Errorf("%s.%s: %w", at, key, err)
		}
	}
	return nil
}

// sectionKeys maps each key a section read into struct type t takes to
// its field's index.
func sectionKeys(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, index := range sectionKeys(f.Type) {
				if _, ok := out[k]; !ok {
					out[k] = append([]int{i}, index...)
				}
			}
			continue
		}
		if f.IsExported() && name != "" && name != "-" {
			out[name] = []int{i}
		}
	}
	return out
}

// keyList is keys sorted and comma-separated, for messages.
func keyList(keys map[string][]int) string {
	return strings.Join(slices.Sorted(maps.Keys(keys)), ", ")
}

// checkSectionKeys refuses a key of mapping n that struct type t takes
// none of (sectionKeys), naming its line and where it is (at, the
// section's dotted path as a file writes it).
func checkSectionKeys(n *yaml.Node, t reflect.Type, at string) error {
	keys := sectionKeys(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := n.Content[i]
		if _, ok := keys[key.Value]; !ok {
			return fmt.Errorf("line %d: %s.%s: unknown key (%s takes %s)", key.Line, at, key.Value, at, keyList(keys))
		}
	}
	return nil
}

var durationType = reflect.TypeFor[time.Duration]()

// decodeValue reads one value of a section into field f.
func decodeValue(raw any, f reflect.Value) error {
	if raw == nil {
		return nil
	}
	if f.Type() == durationType {
		s, ok := raw.(string)
		d, err := time.ParseDuration(s)
		if !ok || err != nil || d < 0 {
			return fmt.Errorf("%s is not a duration like 30s", quoted(raw))
		}
		f.SetInt(int64(d))
		return nil
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return fmt.Errorf("cannot read %s: %v", quoted(raw), err)
	}
	p := reflect.New(f.Type())
	if err := json.Unmarshal(data, p.Interface()); err != nil {
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
			return fmt.Errorf("want %s, got %s", kindOf(f.Type()), quoted(raw))
		}
		return fmt.Errorf("%s: %s", quoted(raw), strings.TrimPrefix(err.Error(), "json: "))
	}
	f.Set(p.Elem())
	return nil
}

// quoted is a value of a section as a message shows it: a string quoted,
// anything else as YAML wrote it, capped.
func quoted(v any) string {
	var s string
	if str, ok := v.(string); ok {
		s = fmt.Sprintf("%q", str)
	} else if data, err := json.Marshal(v); err == nil {
		s = string(data)
	} else {
		s = fmt.Sprint(v)
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

// kindOf names what a field of type t takes, for messages.
func kindOf(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return "a value of type " + t.String()
}
