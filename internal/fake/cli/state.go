package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// state is the fake docker daemon's record of its images and containers,
// kept in $FAKECLI_BASE/fakecli/state.json. An image is a local snapshot
// (imageSnapshot) with the tags and labels docker would keep; a container
// knows its image and labels, so that, as on a real daemon, an image a
// container uses is only untagged by `rmi -f` and refused by `rmi`, and
// committing a name again untags the image that had it. (Unlike docker,
// images have no parents: each commit is a whole copy.)
type state struct {
	Images     map[string]*image     `json:"images"`     // by id, sha256:HEX
	Containers map[string]*container `json:"containers"` // by name
}

type image struct {
	Tags   []string          `json:"tags"`
	Labels map[string]string `json:"labels"`
}

type container struct {
	// Image is the id of a local image, or the reference of one "pulled"
	// (any other image: an empty container).
	Image  string            `json:"image"`
	Labels map[string]string `json:"labels"`
}

// locked runs f with the state, under an exclusive lock for the whole
// call (concurrent clients see one another's changes whole), and saves it
// when f returns nil.
func (c *cli) locked(f func(st *state) error) error {
	dir := filepath.Join(c.base, "fakecli")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	file := filepath.Join(dir, "state.json")
	st := &state{Images: map[string]*image{}, Containers: map[string]*container{}}
	if data, err := os.ReadFile(file); err == nil {
		if err := json.Unmarshal(data, st); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := f(st); err != nil {
		return err
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// newImageID is a fresh image id.
func newImageID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "sha256:" + hex.EncodeToString(b)
}

// imageSnapshot is the local snapshot that holds an image's files.
func imageSnapshot(id string) string { return "img-" + strings.TrimPrefix(id, "sha256:")[:32] }

// normalRef is a reference with docker's default tag.
func normalRef(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i < 0 || strings.Contains(ref[i:], "/") {
		return ref + ":latest"
	}
	return ref
}

// resolve finds the image a reference or an id (whole, with or without
// sha256:, or a prefix of at least 12 hex digits) names.
func (st *state) resolve(ref string) (string, bool) {
	want := normalRef(ref)
	for id, im := range st.Images {
		if slices.Contains(im.Tags, want) {
			return id, true
		}
	}
	hex := strings.TrimPrefix(ref, "sha256:")
	if len(hex) >= 12 {
		for id := range st.Images {
			if strings.HasPrefix(strings.TrimPrefix(id, "sha256:"), hex) {
				return id, true
			}
		}
	}
	return "", false
}

// untag takes the reference off whatever image has it.
func (st *state) untag(ref string) {
	for _, im := range st.Images {
		for i, t := range im.Tags {
			if t == ref {
				im.Tags = append(im.Tags[:i], im.Tags[i+1:]...)
				break
			}
		}
	}
}

// user is a container that uses the image, if one does.
func (st *state) user(id string) (string, bool) {
	var names []string
	for name, ct := range st.Containers {
		if ct.Image == id {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "", false
	}
	return names[0], true
}

// ids are the image ids, sorted.
func (st *state) ids() []string {
	ids := make([]string, 0, len(st.Images))
	for id := range st.Images {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
