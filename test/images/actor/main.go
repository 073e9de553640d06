// Command actor is the workload of torpor's tests: one static binary with a
// subcommand per behaviour a test needs (see ../README.md).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const usage = `usage: actor COMMAND [flags]

commands:
  counter [--port 8080] [--alloc-mib N] [--seed S] [--peer SOCKET] [--ipv6-only]
                                             in-memory counter over TCP and HTTP
  peer [--listen /shared/peer.sock]          sidecar: "ping" -> "pong N" over a unix socket
  tree [--port 8081] [--children 2] [--threads 4]
                                             process tree + threads, reports itself as JSON
  logs [--lines 10] [--interval-ms 10]       numbered lines to stdout/stderr, then sleeps
  exit CODE [--after-ms 0]                   exits with CODE
  oom [--step-mib 16] [--max-mib 4096]       allocates memory until killed
  sleep [--ignore-term]                      sleeps forever
  child                                      internal (used by tree)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	switch cmd {
	case "counter":
		runCounter(args)
	case "tree":
		runTree(args)
	case "child":
		runChild(args)
	case "logs":
		runLogs(args)
	case "exit":
		runExit(args)
	case "oom":
		runOOM(args)
	case "sleep":
		runSleep(args)
	case "peer":
		runPeer(args)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "actor: unknown command %q\n%s", cmd, usage)
		os.Exit(2)
	}
}

// parseArgs parses flags that may be mixed with positional arguments
// ("exit 3 --after-ms 10" and "exit --after-ms 10 3" both work) and returns
// the positional ones.
func parseArgs(fs *flag.FlagSet, args []string) []string {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			os.Exit(2) // flag.ExitOnError has already printed the reason
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

func newFlags(name string) *flag.FlagSet {
	return flag.NewFlagSet("actor "+name, flag.ExitOnError)
}

// exitOnTerm makes SIGTERM and SIGINT end the process with status 0, after
// running cleanup (if not nil). Without a handler a Go program that is PID 1
// of a container would exit with status 2 instead.
func exitOnTerm(cleanup func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		fmt.Printf("got %v, exiting\n", s)
		if cleanup != nil {
			cleanup()
		}
		os.Exit(0)
	}()
}

// sleepForever blocks the calling goroutine forever without keeping a CPU busy.
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "actor: "+format+"\n", a...)
	os.Exit(1)
}
