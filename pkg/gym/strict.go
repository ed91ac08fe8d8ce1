package gym

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// CheckStrict checks the JSON value data against v's type (a pointer to a
// struct) the way a pydantic model with extra="forbid" checks it, at
// every level of the type's structs, slices and maps: each member of an
// object must be one of its struct's JSON names spelled exactly (Go's
// decoder alone takes "Session_Key" for "session_key" and drops names it
// does not know), the names in required must be present in the top
// object, and null is refused where the field's type cannot hold it (a
// string, a number, a bool, a struct: Go's decoder would leave the zero
// value, where Gym's model refuses it). A type that decodes itself
// (json.Unmarshaler: an EpisodeID, a json.RawMessage) is left to its own
// check. It does not decode; the error says where the value is wrong and
// is ErrInvalidRequest.
func CheckStrict(data []byte, v any, required ...string) error {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("gym: CheckStrict needs a pointer to a struct, got %T", v)
	}
	var top map[string]json.RawMessage
	if d := bytes.TrimSpace(data); len(d) == 0 || d[0] != '{' || json.Unmarshal(d, &top) != nil {
		return Refuse(ErrInvalidRequest, "not a JSON object")
	}
	if err := checkValue(data, t.Elem(), ""); err != nil {
		return err
	}
	for _, name := range required {
		if _, ok := top[name]; !ok {
			return Refuse(ErrInvalidRequest, "%s is required", name)
		}
	}
	return nil
}

// DecodeStrict is CheckStrict, then the record decoded into v; an invalid
// record is ErrCheckpointState naming its episode and what is wrong (as
// Gym's restore refuses a record its model does not validate).
func (r Record) DecodeStrict(v any, required ...string) error {
	if err := CheckStrict(r.JSON, v, required...); err != nil {
		return Refuse(ErrCheckpointState, "checkpoint record of episode %q is invalid: %v", r.EpisodeID.CaptureKey(), err)
	}
	dec := json.NewDecoder(bytes.NewReader(r.JSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Refuse(ErrCheckpointState, "checkpoint record of episode %q is invalid: %v", r.EpisodeID.CaptureKey(), err)
	}
	return nil
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

// checkValue checks raw against t; path names the value in errors ("" for
// the top).
func checkValue(raw json.RawMessage, t reflect.Type, path string) error {
	if t.Implements(unmarshaler) || reflect.PointerTo(t).Implements(unmarshaler) {
		return nil
	}
	null := string(bytes.TrimSpace(raw)) == "null"
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		if null || t.Kind() == reflect.Interface {
			return nil
		}
		return checkValue(raw, t.Elem(), path)
	case reflect.Slice, reflect.Array:
		var items []json.RawMessage
		if null || t.Elem().Kind() == reflect.Uint8 || json.Unmarshal(raw, &items) != nil {
			return nil // null is an empty slice; a wrong type is the decoder's to name
		}
		for i, item := range items {
			if err := checkValue(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		var members map[string]json.RawMessage
		if null || json.Unmarshal(raw, &members) != nil {
			return nil
		}
		for k, item := range members {
			if err := checkValue(item, t.Elem(), join(path, k)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Struct:
		if null {
			return Refuse(ErrInvalidRequest, "%s must be an object, not null", nameOf(path))
		}
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) != nil {
			return nil
		}
		fields := jsonFields(t)
		for k, item := range members {
			ft, ok := fields[k]
			if !ok && path == "" {
				return Refuse(ErrInvalidRequest, "unknown field %q", echo(k))
			}
			if !ok {
				return Refuse(ErrInvalidRequest, "%s: unknown field %q", path, echo(k))
			}
			if err := checkValue(item, ft, join(path, k)); err != nil {
				return err
			}
		}
		return nil
	default:
		if null {
			return Refuse(ErrInvalidRequest, "%s must not be null", nameOf(path))
		}
		return nil
	}
}

// jsonFields maps the JSON names of t's fields (as encoding/json names
// them, embedded structs flattened) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, name string) string {
	if path == "" {
		return echo(name)
	}
	return path + "." + echo(name)
}

func nameOf(path string) string {
	if path == "" {
		return "the object"
	}
	return path
}
