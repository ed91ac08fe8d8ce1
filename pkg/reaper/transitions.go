package reaper

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Verb is one of ngsup's verbs, as the transition table names it.
type Verb uint8

// The verbs of the table (version has no launch).
const (
	VerbRun Verb = iota
	VerbWait
	VerbPause
	VerbContinue
	VerbStop
	VerbStatus
	VerbTree

	numVerbs
)

// Verbs lists the verbs of the table, in the order docs/ngsup.md shows them.
var Verbs = []Verb{VerbRun, VerbWait, VerbPause, VerbContinue, VerbStop, VerbStatus, VerbTree}

var verbNames = [numVerbs]struct{ name, phrase, undone string }{
	VerbRun:      {"run", "run", "started"},
	VerbWait:     {"wait", "wait for", ""},
	VerbPause:    {"pause", "pause", "paused"},
	VerbContinue: {"continue", "continue", "continued"},
	VerbStop:     {"stop", "stop", "stopped"},
	VerbStatus:   {"status", "show the status of", ""},
	VerbTree:     {"tree", "list the processes of", ""},
}

// String is the verb as ngsup's command line spells it.
func (v Verb) String() string {
	if v < numVerbs {
		return verbNames[v].name
	}
	return "unknown"
}

// phrase is the verb as a "cannot X a launch in state Y" error says it.
func (v Verb) phrase() string {
	if v < numVerbs {
		return verbNames[v].phrase
	}
	return "act on"
}

// undone is what the verb would have done, for the message of a folder it
// cannot write ("nothing was paused").
func (v Verb) undone() string {
	if v < numVerbs {
		return verbNames[v].undone
	}
	return "done"
}

// Action is what a verb does with a launch in a given state.
type Action uint8

// The actions of the table.
const (
	// NotSeen: the verb never finds the launch in this state: it takes no
	// --id (so a folder without a receipt is Empty to it), or it does not
	// tell a copy apart (it sees the state the copy's receipt names).
	NotSeen Action = iota
	// Refuse: the verb does nothing and exits with the cell's code, with a
	// "cannot X in state Y" error (pause of an ended launch answers with its
	// reply instead: exit 3, "ended").
	Refuse
	// Create: the verb makes the folder and goes on as in Empty (as in
	// Tagged with --id), so that a run started there later finds its file.
	Create
	// CreateWithID: with --id as Create; without, Refuse.
	CreateWithID
	// ByTagWithID: with --id the launch is taken for one without a receipt
	// (Tagged, or Copied): found by its tag, the receipt left as it is and
	// the reply's receipt_error saying why; without, Refuse. Ending a
	// launch must not depend on its record being whole.
	ByTagWithID
	// File: the verb only writes its file (pause, stop) or removes it
	// (continue): no process is touched.
	File
	// Act: the verb does its work on the launch's processes (or, for wait,
	// status and tree, reads them; for run, starts the harness).
	Act
	// Nothing: the verb touches nothing and succeeds.
	Nothing
)

// Cell is what one verb does in one state.
type Cell struct {
	// Do is the action.
	Do Action
	// Exit lists the exit codes the verb can give in this state.
	Exit []int
	// Note says what the verb does, in a few words (docs/ngsup.md).
	Note string
}

// Transition returns what verb v does with a launch in state s.
func Transition(v Verb, s State) Cell {
	if v >= numVerbs || s >= numStates {
		return Cell{}
	}
	return transitions[v][s]
}

// Short forms for the table below.
var (
	exit0     = []int{proto.ExitOK}
	exit2     = []int{proto.ExitUsage}
	exit3     = []int{proto.ExitEnded}
	exit03    = []int{proto.ExitOK, proto.ExitStillRunning}
	exit04    = []int{proto.ExitOK, proto.ExitNotConfirmed}
	exit024   = []int{proto.ExitOK, proto.ExitUsage, proto.ExitNotConfirmed}
	exit034   = []int{proto.ExitOK, proto.ExitEnded, proto.ExitNotConfirmed}
	noReceipt = Cell{Refuse, exit2, "cannot: no launch"}
	badRecord = Cell{Refuse, exit2, "cannot: the receipt is unreadable"}
	notSeen   = Cell{NotSeen, nil, ""}
)

// transitions is the verb x state table: every verb's entry derives the
// launch's state and does what its cell says. docs/ngsup.md shows the same
// table (TableMarkdown), and a test keeps the two alike.
var transitions = [numVerbs][numStates]Cell{
	VerbRun: {
		Missing:      {Create, exit0, "creates the folder, then as empty"},
		Unreadable:   {Refuse, exit2, "cannot: the folder holds a launch"},
		Copied:       notSeen,
		Empty:        {Act, exit0, "starts the harness: waits while the pause file is there, never starts if the stop file is (foreground: exits with the harness's code)"},
		Tagged:       notSeen,
		NeverStarted: {Refuse, exit2, "cannot: the folder holds a launch"},
		Ended:        {Refuse, exit2, "cannot: the folder holds a launch"},
		Pending:      {Refuse, exit2, "cannot: the folder holds a launch"},
		Orphaned:     {Refuse, exit2, "cannot: the folder holds a launch"},
		Paused:       {Refuse, exit2, "cannot: the folder holds a launch"},
		Running:      {Refuse, exit2, "cannot: the folder holds a launch"},
	},
	VerbWait: {
		Missing:      noReceipt,
		Unreadable:   badRecord,
		Copied:       notSeen,
		Empty:        noReceipt,
		Tagged:       notSeen,
		NeverStarted: {Act, exit0, "the receipt at once"},
		Ended:        {Act, exit0, "the receipt at once"},
		Pending:      {Act, exit03, "blocks until the end; supervisor gone: ended, exit code -1"},
		Orphaned:     {Act, exit03, "blocks until the end; harness gone too: ended, exit code -1"},
		Paused:       {Act, exit03, "blocks until the end"},
		Running:      {Act, exit03, "blocks until the end"},
	},
	VerbPause: {
		Missing:      {Create, exit0, "creates the folder, then as empty"},
		Unreadable:   badRecord,
		Copied:       notSeen,
		Empty:        {File, exit0, "pause file only: a run started later waits"},
		Tagged:       {Act, exit04, "pauses the processes found by the tag and the known set"},
		NeverStarted: {Refuse, exit3, "cannot: replies ended, the result kept"},
		Ended:        {Refuse, exit3, "cannot: replies ended, the result kept"},
		Pending:      {File, exit0, "pause file only: the run keeps waiting"},
		Orphaned:     {Act, exit034, "pauses the processes found by the known set and the tag"},
		Paused:       {Act, exit034, "pauses again, keeping what the last pause held"},
		Running:      {Act, exit034, "pauses every process (3: it ended meanwhile)"},
	},
	VerbContinue: {
		Missing:      {CreateWithID, exit024, "with --id: creates the folder, then as tagged; without: cannot, no launch"},
		Unreadable:   badRecord,
		Copied:       notSeen,
		Empty:        {File, exit0, "removes the pause file"},
		Tagged:       {Act, exit04, "continues what is stopped, found by the tag and the known set"},
		NeverStarted: {File, exit0, "removes the pause file"},
		Ended:        {Act, exit04, "continues what the last pause held and what is stopped"},
		Pending:      {File, exit0, "removes the pause file: the run starts"},
		Orphaned:     {Act, exit04, "continues what the last pause held and what is stopped"},
		Paused:       {Act, exit04, "continues what the last pause held and what is stopped"},
		Running:      {Act, exit04, "continues what is stopped"},
	},
	VerbStop: {
		Missing:      {Create, exit0, "creates the folder, then as empty"},
		Unreadable:   {ByTagWithID, exit024, "with --id: as tagged, receipt_error says why; without: cannot"},
		Copied:       {Nothing, exit0, "nothing searched or signalled: copied"},
		Empty:        {File, exit0, "stop file only: a run started later never starts"},
		Tagged:       {Act, exit04, "ends the processes found by the tag and the known set"},
		NeverStarted: {Act, exit04, "ends what the known set and the tag find: ended"},
		Ended:        {Act, exit04, "ends what the harness left: ended"},
		Pending:      {Act, exit04, "ends the waiting supervisor and records the end"},
		Orphaned:     {Act, exit04, "ends the processes found by the known set and the tag: partial"},
		Paused:       {Act, exit04, "ends every process"},
		Running:      {Act, exit04, "ends every process"},
	},
	VerbStatus: {
		Missing:      noReceipt,
		Unreadable:   badRecord,
		Copied:       notSeen,
		Empty:        noReceipt,
		Tagged:       notSeen,
		NeverStarted: {Act, exit0, "prints the receipt"},
		Ended:        {Act, exit0, "prints the receipt, removes the empty cgroup"},
		Pending:      {Act, exit0, "prints the receipt"},
		Orphaned:     {Act, exit0, "prints the receipt"},
		Paused:       {Act, exit0, "prints the receipt"},
		Running:      {Act, exit0, "prints the receipt"},
	},
	VerbTree: {
		Missing:      noReceipt,
		Unreadable:   badRecord,
		Copied:       notSeen,
		Empty:        noReceipt,
		Tagged:       notSeen,
		NeverStarted: {Act, exit0, "lists what the known set and the tag find"},
		Ended:        {Act, exit0, "lists what the harness left"},
		Pending:      {Act, exit0, "lists the supervisor"},
		Orphaned:     {Act, exit0, "lists what the known set and the tag find"},
		Paused:       {Act, exit0, "lists every process"},
		Running:      {Act, exit0, "lists every process"},
	},
}

// looksForCopies says whether v tells a copied folder apart.
func looksForCopies(v Verb) bool { return Transition(v, Copied).Do != NotSeen }

// refuse is v's "cannot X in state Y" error, wrapping why (which names the
// folder, and whose class gives the exit code).
func refuse(v Verb, s State, why error) error {
	return &StateError{Verb: v, State: s, Err: why}
}

// TableMarkdown renders the transition table as docs/ngsup.md shows it: a
// row per state, a column per verb, each cell what the verb does and its
// exit codes.
func TableMarkdown() string {
	var b strings.Builder
	b.WriteString("| state |")
	for _, v := range Verbs {
		fmt.Fprintf(&b, " `%s` |", v)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(Verbs)))
	b.WriteString("\n")
	for _, s := range States {
		fmt.Fprintf(&b, "| %s |", s)
		for _, v := range Verbs {
			c := Transition(v, s)
			if c.Do == NotSeen {
				b.WriteString(" - |")
				continue
			}
			codes := make([]string, len(c.Exit))
			for i, e := range c.Exit {
				codes[i] = strconv.Itoa(e)
			}
			fmt.Fprintf(&b, " %s; exit %s |", c.Note, strings.Join(codes, ", "))
		}
		b.WriteString("\n")
	}
	return b.String()
}
