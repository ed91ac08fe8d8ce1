package main

// The fixtures of the end-to-end tests: real processes, written in Go. The
// test binary runs itself again with NGSUP_TEST_HELPER=<name> in its
// environment; TestMain then runs the fixture of that name and exits (the
// os/exec test style). Fixtures record their pids ("pid start") in the folder
// named by NGSUP_TEST_REC, one file per role, so that the tests can find
// them and the cleanup can end them by pid.

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fixtures maps a helper name to its body; the exit code is the process's.
var fixtures = map[string]func(args []string) int{
	"harness":      fixtureHarness,
	"idle":         fixtureIdle,
	"spawn-daemon": fixtureSpawnDaemon,
	"threads":      fixtureThreads,
	"zombie-lead":  fixtureZombieLeader,
	"vfork":        fixtureVfork,
	"storm":        fixtureStorm,
	"counter":      fixtureCounter,
	"steps":        fixtureSteps,
	"respawner":    fixtureRespawner,
	"int-spawner":  fixtureIntSpawner,
}

func init() {
	// These fixtures need main to run on the main thread (the thread-group
	// leader): init runs on the main goroutine, and locking it here keeps
	// main there.
	switch os.Getenv(helperEnv) {
	case "zombie-lead", "vfork":
		runtime.LockOSThread()
	}
}

func runHelper(name string, args []string) int {
	f, ok := fixtures[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "no fixture %q\n", name)
		return 99
	}
	return f(args)
}

func must(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "fixture %s (pid %d): %v\n", os.Getenv(helperEnv), os.Getpid(), err)
		os.Exit(98)
	}
}

// sleepForever parks the calling goroutine for good.
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

// helperProc prepares the fixture name as a child of this process.
func helperProc(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), helperEnv+"="+name)
	return cmd
}

// startRecorded starts cmd, records it under role and reaps it when it ends.
func startRecorded(role string, cmd *exec.Cmd) {
	must(cmd.Start())
	must(writeRecord(role, cmd.Process.Pid))
	go cmd.Wait()
}

// fixtureHarness is the general harness. In order: it ignores SIGINT
// (-ignore-int), records itself as "harness", creates -marker, starts the
// children asked for (-daemon: a double-forked daemon in a session of its
// own; -orphan-noenv: a double-forked sleep with an empty environment; -setsid: a sleep in a session of its own; -noenv: a sleep with an empty
// environment; -bg: a sleep in its own process group; -setsid-helper NAME: the
// fixture NAME in a session of its own, recording itself as NAME;
// -daemon-of NAME: the fixture NAME double-forked in a session of its own),
// waits for
// -until to exist, then dies of SIGTERM (-term) or exits with -exit (sleeping
// forever when -exit is negative).
func fixtureHarness(args []string) int {
	fl := flag.NewFlagSet("harness", flag.ContinueOnError)
	ignoreInt := fl.Bool("ignore-int", false, "ignore SIGINT")
	marker := fl.String("marker", "", "create this file first")
	daemon := fl.Bool("daemon", false, "start a double-forked daemon")
	orphanNoenv := fl.Bool("orphan-noenv", false, "start a double-forked sleep with an empty environment")
	setsid := fl.Bool("setsid", false, "start a sleep in a session of its own")
	noenv := fl.Bool("noenv", false, "start a sleep with an empty environment")
	bg := fl.Bool("bg", false, "start a sleep in the harness's process group")
	setsidHelper := fl.String("setsid-helper", "", "start this fixture in a session of its own")
	daemonOf := fl.String("daemon-of", "", "start this fixture double-forked in a session of its own")
	until := fl.String("until", "", "wait until this file exists")
	term := fl.Bool("term", false, "die of SIGTERM")
	exit := fl.Int("exit", -1, "exit with this code (negative: never exit)")
	must(fl.Parse(args))
	if *ignoreInt {
		signal.Ignore(unix.SIGINT)
	}
	must(writeRecord("harness", os.Getpid()))
	if *marker != "" {
		must(os.WriteFile(*marker, []byte("started\n"), 0o644))
	}
	if *daemon {
		// The middle process exits at once, orphaning the daemon.
		must(helperProc("spawn-daemon").Run())
	}
	if *orphanNoenv {
		must(helperProc("spawn-daemon", "-noenv").Run())
	}
	if *daemonOf != "" {
		must(helperProc("spawn-daemon", "-as", *daemonOf).Run())
	}
	if *setsid {
		cmd := exec.Command("/bin/sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		startRecorded("setsid", cmd)
	}
	if *noenv {
		cmd := exec.Command("/bin/sleep", "1000")
		cmd.Env = []string{}
		startRecorded("noenv", cmd)
	}
	if *bg {
		startRecorded("bg", exec.Command("/bin/sleep", "1000"))
	}
	if *setsidHelper != "" {
		cmd := helperProc(*setsidHelper, "-role", *setsidHelper)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		must(cmd.Start())
		go cmd.Wait()
	}
	for *until != "" && !exists(*until) {
		time.Sleep(5 * time.Millisecond)
	}
	if *term {
		signal.Reset(unix.SIGTERM)
		unix.Kill(os.Getpid(), unix.SIGTERM)
		sleepForever()
	}
	if *exit >= 0 {
		return *exit
	}
	sleepForever()
	return 0
}

// fixtureSpawnDaemon starts "idle" as the role "daemon" in a session of its
// own, and exits without waiting for it. With -noenv it starts instead a
// sleep with an empty environment in a session of its own, the role
// "orphan-noenv": once orphaned it is neither tagged nor anyone's descendant.
// With -as NAME it starts the fixture NAME, which records itself once it is
// ready, with this process's pid as its argument.
func fixtureSpawnDaemon(args []string) int {
	fl := flag.NewFlagSet("spawn-daemon", flag.ContinueOnError)
	noenv := fl.Bool("noenv", false, "start an untagged sleep instead")
	as := fl.String("as", "", "start this fixture instead")
	must(fl.Parse(args))
	role, cmd := "daemon", helperProc("idle", "daemon")
	switch {
	case *noenv:
		role, cmd = "orphan-noenv", exec.Command("/bin/sleep", "1000")
		cmd.Env = []string{}
	case *as != "":
		role, cmd = "", helperProc(*as, strconv.Itoa(os.Getpid()))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	must(cmd.Start())
	if role != "" {
		must(writeRecord(role, cmd.Process.Pid))
	}
	return 0
}

// fixtureIdle records itself under the role args[0] and sleeps forever.
func fixtureIdle(args []string) int {
	if len(args) > 0 {
		must(writeRecord(args[0], os.Getpid()))
	}
	sleepForever()
	return 0
}

// fixtureThreads starts -n goroutines, each locked to an OS thread of its
// own, that each start -k sleeps in sessions of their own and then wait for
// them on that thread: the children of this process are forked by several
// threads, and /proc/PID/task/TID/children lists each under its own thread.
// Roles: "harness", "child-I-J".
func fixtureThreads(args []string) int {
	fl := flag.NewFlagSet("threads", flag.ContinueOnError)
	n := fl.Int("n", 4, "threads")
	k := fl.Int("k", 3, "children per thread")
	must(fl.Parse(args))
	must(writeRecord("harness", os.Getpid()))
	for i := 0; i < *n; i++ {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread stays this goroutine's
			var cmds []*exec.Cmd
			for j := 0; j < *k; j++ {
				cmd := exec.Command("/bin/sleep", "1000")
				cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
				must(cmd.Start())
				must(writeRecord(fmt.Sprintf("child-%d-%d", i, j), cmd.Process.Pid))
				cmds = append(cmds, cmd)
			}
			for _, cmd := range cmds {
				cmd.Wait()
			}
			sleepForever()
		}()
	}
	sleepForever()
	return 0
}

// fixtureZombieLeader leaves a thread-group leader that exited while its
// threads run: main runs on the main thread (locked in init); -n goroutines,
// each on a thread of its own, keep working (a short sleep and a count, in a
// loop); then the main thread calls the raw exit syscall (not exit_group).
// /proc/PID/stat then shows Z while the threads live. The garbage collector is
// off: a stop-the-world could never stop the gone main thread.
func fixtureZombieLeader(args []string) int {
	fl := flag.NewFlagSet("zombie-lead", flag.ContinueOnError)
	n := fl.Int("n", 3, "working threads")
	role := fl.String("role", "harness", "the role to record")
	must(fl.Parse(args))
	debug.SetGCPercent(-1)
	runtime.GOMAXPROCS(*n + 4)
	var work atomic.Int64
	var started atomic.Int32
	for i := 0; i < *n; i++ {
		go func() {
			runtime.LockOSThread()
			started.Add(1)
			ts := unix.Timespec{Nsec: int64(2 * time.Millisecond)}
			for {
				unix.Nanosleep(&ts, nil)
				work.Add(1)
			}
		}()
	}
	for started.Load() < int32(*n) {
		time.Sleep(time.Millisecond)
	}
	must(writeRecord(*role, os.Getpid()))
	syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
	panic("unreachable")
}

// fixtureVfork leaves a vfork parent: its main thread (locked in init) calls
// the raw clone syscall with CLONE_VFORK|SIGCHLD and without CLONE_VM, so it
// waits in D until the child execs or exits. The child makes raw syscalls
// only: a nanosleep of 1000 s, then exit_group.
func fixtureVfork(args []string) int {
	debug.SetGCPercent(-1)
	runtime.GOMAXPROCS(4)
	must(writeRecord("harness", os.Getpid()))
	ts := unix.Timespec{Sec: 1000}
	vforkSleep(&ts)
	sleepForever()
	return 0
}

// vforkSleep is the raw vfork. The child shares nothing with the Go runtime
// it copied: no stack check (nosplit), no race detector calls (norace), all
// signals blocked (so no Go handler runs in it), raw syscalls only. The
// parent's thread is held by the kernel until the child exits.
//
//go:nosplit
//go:norace
func vforkSleep(ts *unix.Timespec) {
	all := ^uint64(0)
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&all)), 0, 8, 0, 0)
	r1, _, _ := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(unix.CLONE_VFORK|unix.SIGCHLD), 0, 0, 0, 0, 0)
	if r1 == 0 {
		syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(ts)), 0, 0)
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
}

// fixtureStorm starts a new /bin/sleep child every -every, forever, in its own
// process group, and reaps them.
func fixtureStorm(args []string) int {
	fl := flag.NewFlagSet("storm", flag.ContinueOnError)
	every := fl.Duration("every", 2*time.Millisecond, "time between forks")
	life := fl.String("life", "1", "how long each sleep lives")
	must(fl.Parse(args))
	must(writeRecord("harness", os.Getpid()))
	go func() {
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(-1, &ws, 0, nil); err == unix.ECHILD {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}}
	for {
		syscall.ForkExec("/bin/sleep", []string{"sleep", *life}, attr)
		time.Sleep(*every)
	}
}

// fixtureCounter writes a counter to -file every 10 ms (the whole file each
// time). With -child it first starts a copy of itself, in a session of its
// own, that writes -file.child. Roles: "harness" or "counter-child".
func fixtureCounter(args []string) int {
	fl := flag.NewFlagSet("counter", flag.ContinueOnError)
	file := fl.String("file", "", "the file to write")
	child := fl.Bool("child", false, "start a child that writes FILE.child")
	role := fl.String("role", "harness", "the role to record")
	must(fl.Parse(args))
	must(writeRecord(*role, os.Getpid()))
	if *child {
		cmd := helperProc("counter", "-file", *file+".child", "-role", "counter-child")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		must(cmd.Start())
		go cmd.Wait()
	}
	for i := 1; ; i++ {
		must(os.WriteFile(*file, []byte(strconv.Itoa(i)+"\n"), 0o644))
		time.Sleep(10 * time.Millisecond)
	}
}

// fixtureSteps appends the lines 1..-n to -file, one at a time with -gap
// between, and exits 0.
func fixtureSteps(args []string) int {
	fl := flag.NewFlagSet("steps", flag.ContinueOnError)
	file := fl.String("file", "", "the file to append to")
	n := fl.Int("n", 40, "steps")
	gap := fl.Duration("gap", 20*time.Millisecond, "time between steps")
	must(fl.Parse(args))
	must(writeRecord("harness", os.Getpid()))
	for i := 1; i <= *n; i++ {
		f, err := os.OpenFile(*file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		must(err)
		_, err = f.WriteString(strconv.Itoa(i) + "\n")
		must(err)
		must(f.Close())
		time.Sleep(*gap)
	}
	return 0
}

// respawnerKids is how many children the respawner keeps.
const respawnerKids = 16

// fixtureRespawner is a daemon as a shell's `while :; do sleep 3600; done`
// is: it ignores SIGINT (as a shell's background job does, and its children
// with it), keeps respawnerKids sleeps and starts a new one the moment one
// dies. A kill sweep that reaches a child before the respawner gives it the
// time to fork a replacement the sweep has not seen.
func fixtureRespawner(args []string) int {
	signal.Ignore(unix.SIGINT)
	must(writeRecord("respawner", os.Getpid()))
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}}
	spawn := func() {
		_, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "1000"}, attr)
		must(err)
	}
	for i := 0; i < respawnerKids; i++ {
		spawn()
	}
	for {
		var ws unix.WaitStatus
		if pid, err := unix.Wait4(-1, &ws, 0, nil); err == nil && pid > 0 {
			spawn()
		}
	}
}

// fixtureIntSpawner is a daemon that cleans up on SIGINT by starting a
// helper and exiting: once adopted (its parent, args[0], exits at once),
// it records itself; on SIGINT it waits until the process that adopted it (the
// supervisor) is gone, or a second, double-forks a sleep in a session of
// its own with an empty environment (spawn-daemon -noenv, the role
// "orphan-noenv") and exits. The sleep is born after every earlier pass, to
// a parent gone at once, and neither is there by the next pass.
func fixtureIntSpawner(args []string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT)
	middle, err := strconv.Atoi(args[0]) // the parent that exits at once
	must(err)
	for os.Getppid() == middle {
		time.Sleep(time.Millisecond)
	}
	adopter := os.Getppid()
	must(writeRecord("int-spawner", os.Getpid()))
	<-sigs
	for deadline := time.Now().Add(time.Second); os.Getppid() == adopter && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	// Ignored from here on, and so in the helpers: a SIGINT of the stop's
	// next walk must not end them before the sleep is started.
	signal.Ignore(unix.SIGINT)
	must(helperProc("spawn-daemon", "-noenv").Run())
	return 0
}
