package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// runLogs prints "line I stdout" / "line I stderr" alternately (odd I to
// stdout, even I to stderr), then sleeps. --lines 0 prints forever.
func runLogs(args []string) {
	fs := newFlags("logs")
	lines := fs.Int("lines", 10, "number of lines to print (0: forever)")
	interval := fs.Int("interval-ms", 10, "pause between two lines, in ms")
	if rest := parseArgs(fs, args); len(rest) != 0 {
		fatalf("logs: unexpected arguments %q", rest)
	}
	exitOnTerm(nil)
	for i := 1; *lines == 0 || i <= *lines; i++ {
		if i%2 == 1 {
			fmt.Fprintf(os.Stdout, "line %d stdout\n", i)
		} else {
			fmt.Fprintf(os.Stderr, "line %d stderr\n", i)
		}
		if *interval > 0 {
			time.Sleep(time.Duration(*interval) * time.Millisecond)
		}
	}
	sleepForever()
}

// runExit exits with the given status after --after-ms.
func runExit(args []string) {
	fs := newFlags("exit")
	after := fs.Int("after-ms", 0, "delay before exiting, in ms")
	rest := parseArgs(fs, args)
	if len(rest) != 1 {
		fatalf("usage: actor exit CODE [--after-ms M]")
	}
	code, err := strconv.Atoi(rest[0])
	if err != nil || code < 0 || code > 255 {
		fatalf("exit: CODE must be 0..255, got %q", rest[0])
	}
	exitOnTerm(nil)
	time.Sleep(time.Duration(*after) * time.Millisecond)
	fmt.Printf("exiting with %d\n", code)
	os.Exit(code)
}

// runOOM allocates and touches memory in steps until the kernel kills it.
// --max-mib is a safety cap for runs without a memory limit: once reached,
// it stops allocating and sleeps (0 removes the cap).
func runOOM(args []string) {
	fs := newFlags("oom")
	step := fs.Int("step-mib", 16, "MiB allocated per step")
	max := fs.Int("max-mib", 4096, "stop allocating at this many MiB (0: never)")
	if rest := parseArgs(fs, args); len(rest) != 0 {
		fatalf("oom: unexpected arguments %q", rest)
	}
	exitOnTerm(nil)
	var hold [][]byte
	total := 0
	for *max == 0 || total+*step <= *max {
		b := make([]byte, *step<<20)
		for i := 0; i < len(b); i += pageSize {
			b[i] = byte(i/pageSize) | 1
		}
		hold = append(hold, b)
		total += *step
		fmt.Printf("allocated %d MiB\n", total)
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("reached --max-mib %d without being killed, sleeping\n", *max)
	_ = hold
	sleepForever()
}

// runSleep sleeps forever; SIGTERM exits 0 unless --ignore-term.
func runSleep(args []string) {
	fs := newFlags("sleep")
	ignore := fs.Bool("ignore-term", false, "ignore SIGTERM (and SIGINT): only SIGKILL ends it")
	if rest := parseArgs(fs, args); len(rest) != 0 {
		fatalf("sleep: unexpected arguments %q", rest)
	}
	if *ignore {
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
		fmt.Println("sleeping, ignoring SIGTERM")
	} else {
		exitOnTerm(nil)
		fmt.Println("sleeping")
	}
	sleepForever()
}
