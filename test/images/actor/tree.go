package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// treeReport is the JSON line the tree's port answers with.
type treeReport struct {
	PID           int      `json:"pid"`
	Children      []int    `json:"children"`       // pids of the forked children
	ChildrenAlive int      `json:"children_alive"` // how many of them are still running
	Threads       int      `json:"threads"`        // counting threads started (--threads)
	OSThreads     int      `json:"os_threads"`     // threads of this process (/proc/self/status)
	Ticks         uint64   `json:"ticks"`          // sum of the counting threads' ticks
	ThreadTicks   []uint64 `json:"thread_ticks"`   // per counting thread
}

type tree struct {
	children []*exec.Cmd
	mu       sync.Mutex
	exited   map[int]bool
	ticks    []atomic.Uint64
}

func runTree(args []string) {
	fs := newFlags("tree")
	port := fs.Int("port", 8081, "TCP port to listen on")
	nChildren := fs.Int("children", 2, "child processes to fork")
	nThreads := fs.Int("threads", 4, "counting OS threads to start")
	if rest := parseArgs(fs, args); len(rest) != 0 {
		fatalf("tree: unexpected arguments %q", rest)
	}

	t := &tree{exited: map[int]bool{}, ticks: make([]atomic.Uint64, *nThreads)}
	exitOnTerm(t.stopChildren)

	self, err := os.Executable()
	if err != nil {
		fatalf("tree: find own executable: %v", err)
	}
	for i := 0; i < *nChildren; i++ {
		cmd := exec.Command(self, "child")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fatalf("tree: start child %d: %v", i, err)
		}
		t.children = append(t.children, cmd)
		go func(cmd *exec.Cmd) { // reap it, so no zombie is left behind
			_ = cmd.Wait()
			t.mu.Lock()
			t.exited[cmd.Process.Pid] = true
			t.mu.Unlock()
		}(cmd)
	}
	for i := 0; i < *nThreads; i++ {
		go func(i int) {
			runtime.LockOSThread() // this goroutine owns an OS thread for good
			for {
				t.ticks[i].Add(1)
				time.Sleep(10 * time.Millisecond)
			}
		}(i)
	}

	ln := listen(*port)
	for {
		conn, err := ln.Accept()
		if err != nil {
			fatalf("accept: %v", err)
		}
		go t.serve(conn)
	}
}

func (t *tree) report() treeReport {
	r := treeReport{PID: os.Getpid(), Children: []int{}, Threads: len(t.ticks), OSThreads: osThreads()}
	t.mu.Lock()
	for _, c := range t.children {
		r.Children = append(r.Children, c.Process.Pid)
		if !t.exited[c.Process.Pid] {
			r.ChildrenAlive++
		}
	}
	t.mu.Unlock()
	for i := range t.ticks {
		n := t.ticks[i].Load()
		r.ThreadTicks = append(r.ThreadTicks, n)
		r.Ticks += n
	}
	return r
}

// serve answers every connection with one JSON line and closes it. A client
// that sends an HTTP request within 200 ms gets the JSON as an HTTP body.
func (t *tree) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	line, _ := br.ReadString('\n')
	_ = conn.SetReadDeadline(time.Time{})
	line = strings.TrimRight(line, "\r\n")
	if isHTTPRequestLine(line) {
		req, err := readHTTPRequest(line, br)
		if err != nil {
			return
		}
		if req.isProbe() {
			writeHTTP(conn, 200, "text/plain", "ok")
			return
		}
		body, _ := json.Marshal(t.report())
		writeHTTP(conn, 200, "application/json", string(body)+"\n")
		return
	}
	body, _ := json.Marshal(t.report())
	fmt.Fprintf(conn, "%s\n", body)
}

func (t *tree) stopChildren() {
	for _, c := range t.children {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
}

// osThreads reads the "Threads:" line of /proc/self/status (0 if unreadable).
func osThreads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// runChild is a child of "actor tree": it counts until SIGTERM, or until its
// parent is gone (it then got re-parented).
func runChild(args []string) {
	if len(args) != 0 {
		fatalf("child: unexpected arguments %q", args)
	}
	exitOnTerm(nil)
	parent := os.Getppid()
	var ticks uint64
	for {
		ticks++
		if os.Getppid() != parent {
			os.Exit(0)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
