package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
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

// peerConn is the counter's one connection to its sidecar, held open for
// the process's life: an app and its sidecar in one pod.
type peerConn struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// dialPeer connects to the sidecar's unix socket at path, waiting for it to
// listen (the two containers start in either order).
func dialPeer(path string) *peerConn {
	for i := 0; ; i++ {
		conn, err := net.Dial("unix", path)
		if err == nil {
			fmt.Printf("connected to peer %s\n", path)
			return &peerConn{conn: conn, r: bufio.NewReader(conn)}
		}
		if i == 600 {
			fatalf("dial peer %s: %v", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ping sends "ping" over the held connection (if send) and returns the
// sidecar's answer (if read, else "sent"), or "ERR ..." (never redialed: a
// broken connection stays broken).
func (p *peerConn) ping(send, read bool) string {
	if p == nil {
		return "ERR no --peer"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn.SetDeadline(time.Now().Add(5 * time.Second))
	if send {
		if _, err := fmt.Fprintln(p.conn, "ping"); err != nil {
			return "ERR write: " + err.Error()
		}
	}
	if !read {
		// Returns once the answer is queued in the kernel, unread.
		for i := 0; i < 500 && p.queued() == 0; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		return fmt.Sprintf("sent, %d bytes queued", p.queued())
	}
	line, err := p.r.ReadString('\n')
	if err != nil {
		return "ERR read: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// queued is the number of bytes waiting in the connection's receive queue
// (FIONREAD), not yet read by the process.
func (p *peerConn) queued() int {
	sc, err := p.conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return -1
	}
	n := 0
	sc.Control(func(fd uintptr) {
		syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	})
	return n
}

// runPeer is the sidecar: it listens on a unix socket and answers each
// "ping" line with "pong N", N counting the pings of all its connections.
func runPeer(args []string) {
	fs := newFlags("peer")
	path := fs.String("listen", "/shared/peer.sock", "unix socket to listen on")
	if rest := parseArgs(fs, args); len(rest) != 0 {
		fatalf("peer: unexpected arguments %q", rest)
	}
	exitOnTerm(nil)
	os.Remove(*path)
	ln, err := net.Listen("unix", *path)
	if err != nil {
		fatalf("peer: listen %s: %v", *path, err)
	}
	fmt.Printf("peer listening on %s\n", *path)
	var mu sync.Mutex
	var n int64
	for {
		conn, err := ln.Accept()
		if err != nil {
			fatalf("peer: accept: %v", err)
		}
		go func() {
			defer conn.Close()
			r := bufio.NewReader(conn)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if strings.TrimSpace(line) != "ping" {
					fmt.Fprintf(conn, "ERR unknown %q\n", line)
					continue
				}
				mu.Lock()
				n++
				v := n
				mu.Unlock()
				fmt.Fprintf(conn, "pong %d\n", v)
			}
		}()
	}
}
