package claude

import "errors"

// ErrUnmatched is a launch's stdout that cannot be matched with its saved
// session (Unsaved): nothing is added to the session, and the launch
// record's reason says why.
var ErrUnmatched = errors.New("the launch's stdout does not match its saved session")
