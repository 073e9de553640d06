package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const pageSize = 4096

// ballast is the memory allocated by --alloc-mib. It is a package variable so
// it stays reachable (and resident) for the life of the process.
var ballast []byte

type counter struct {
	mu sync.Mutex
	n  int64
	// peer is the one connection to the sidecar (--peer), dialed at start.
	peer *peerConn
	// shared is a page of a file mapped MAP_SHARED (--shared-mem): memory
	// another container of the pod maps too.
	shared []byte
	// fifo is a named pipe shared with another container of the pod
	// (--fifo-read or --fifo-write), opened in the background.
	fifo fifoEnd
}

func (c *counter) inc() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}

func (c *counter) get() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func runCounter(args []string) {
	fs := newFlags("counter")
	port := fs.Int("port", 8080, "TCP port to listen on")
	allocMiB := fs.Int("alloc-mib", 0, "MiB of memory to allocate, fill and keep live")
	seed := fs.Uint64("seed", 0, "varies the --alloc-mib pattern (two actors with different seeds share no page)")
	peerPath := fs.String("peer", "", "unix socket of a sidecar (actor peer) to dial once and keep for the process's life")
	sharedPath := fs.String("shared-mem", "", "file (e.g. in the pod's /dev/shm) whose first page is mapped shared; `shared` increments its counter")
	fifoRead := fs.String("fifo-read", "", "named pipe (made if missing) to read from: `fifo read` reads a line")
	fifoWrite := fs.String("fifo-write", "", "named pipe (made if missing) to write to: `fifo send` writes a line")
	ipv6Only := fs.Bool("ipv6-only", false, "listen on [::] IPv6-only (IPV6_V6ONLY), not on every address of both families")
	if rest := parseArgs(fs, args); len(rest) != 0 {
		fatalf("counter: unexpected arguments %q", rest)
	}
	exitOnTerm(nil)

	if *allocMiB > 0 {
		ballast = make([]byte, *allocMiB<<20)
		fill(ballast, *seed)
		fmt.Printf("allocated %d MiB, crc32c %s\n", *allocMiB, checksum())
	}

	c := &counter{}
	if *peerPath != "" {
		c.peer = dialPeer(*peerPath)
	}
	if *sharedPath != "" {
		c.shared = mapShared(*sharedPath)
	}
	if *fifoRead != "" && *fifoWrite != "" {
		fatalf("counter: --fifo-read and --fifo-write: one end per process")
	} else if *fifoRead != "" {
		c.fifo.open(*fifoRead, false)
	} else if *fifoWrite != "" {
		c.fifo.open(*fifoWrite, true)
	}
	network := "tcp"
	if *ipv6Only {
		network = "tcp6" // Go sets IPV6_V6ONLY on a "tcp6" wildcard listener
	}
	ln := listenOn(network, *port)
	for {
		conn, err := ln.Accept()
		if err != nil {
			fatalf("accept: %v", err)
		}
		go c.serve(conn)
	}
}

// fill writes distinct, non-zero pseudo-random data to every page of b so
// that no page is a zero page and no two pages are identical (nothing can
// be deduplicated or skipped by a checkpoint).
func fill(b []byte, seed uint64) {
	for p := 0; p+pageSize <= len(b); p += pageSize {
		x := (uint64(p/pageSize)*0x9E3779B97F4A7C15 ^ seed*0xBF58476D1CE4E5B9) | 1
		for i := p; i < p+pageSize; i += 8 {
			// xorshift64: never yields 0 from a non-zero state
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(b[i:], x)
		}
	}
}

// touched counts the calls of touch: each rewrites the next 1% of the ballast.
var touched int

// touch rewrites 1% of the ballast (one contiguous run of pages, the next one
// on every call) with new data, as an actor that changed a little of its
// state between two suspends. Returns the number of bytes rewritten.
func touch() int {
	pages := len(ballast) / pageSize
	n := pages / 100
	if n == 0 {
		return 0
	}
	start := (touched * n) % (pages - n + 1)
	touched++
	for p := start; p < start+n; p++ {
		x := uint64(p+touched*pages)*0xD1B54A32D192ED03 | 1
		for i := p * pageSize; i < (p+1)*pageSize; i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(ballast[i:], x)
		}
	}
	return n * pageSize
}

// checksum is the CRC-32C of the ballast, as 8 hex digits ("00000000" when
// nothing was allocated). It is the same before a checkpoint and after a
// restore if the memory came back intact.
func checksum() string {
	return fmt.Sprintf("%08x", crc32.Checksum(ballast, crc32.MakeTable(crc32.Castagnoli)))
}

// serve speaks two protocols on one port, told apart by the first line:
//   - line protocol: "inc" -> "N", "get" -> "N", "sum" -> "crc32c",
//     "touch" -> bytes rewritten, "whoami" -> the connection's peer address
//     (ADDR:PORT, as getpeername(2) gives it), "peer" -> the sidecar's answer over the
//     unix connection dialed at start ("pong N", or "ERR ..."; "peer send"
//     only asks, leaving the answer queued, "peer read" only reads it), "note TEXT" -> TEXT appended as a line to
//     /var/notes (opened once, kept open for the process's life) -> the
//     file's size, any number of commands per connection;
//   - HTTP/1.x: GET /inc, /get, /sum, /healthz; one request per connection.
func (c *counter) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil && (err != io.EOF || line == "") {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		if isHTTPRequestLine(line) {
			c.serveHTTP(conn, line, br)
			return
		}
		if text, ok := strings.CutPrefix(strings.TrimSpace(line), "note "); ok {
			fmt.Fprintln(conn, note(text))
			continue
		}
		switch strings.TrimSpace(line) {
		case "inc":
			fmt.Fprintf(conn, "%d\n", c.inc())
		case "get":
			fmt.Fprintf(conn, "%d\n", c.get())
		case "sum":
			fmt.Fprintf(conn, "%s\n", checksum())
		case "touch":
			fmt.Fprintf(conn, "%d\n", touch())
		case "whoami":
			// The connection's peer as this process sees it (getpeername):
			// a client's own address, or a proxy's.
			fmt.Fprintln(conn, conn.RemoteAddr().String())
		case "shared":
			fmt.Fprintln(conn, c.sharedInc())
		case "fifo send":
			fmt.Fprintln(conn, c.fifo.send())
		case "fifo read":
			fmt.Fprintln(conn, c.fifo.read())
		case "peer":
			fmt.Fprintln(conn, c.peer.ping(true, true))
		case "peer send":
			fmt.Fprintln(conn, c.peer.ping(true, false))
		case "peer read":
			fmt.Fprintln(conn, c.peer.ping(false, true))
		case "":
		default:
			fmt.Fprintf(conn, "ERR unknown command %q\n", line)
		}
		if err != nil { // EOF after a last line without newline
			return
		}
	}
}

var notes struct {
	sync.Mutex
	f *os.File
}

// note appends text to /var/notes through a descriptor held open, so a
// checkpoint of the process holds an open file of the container's rootfs.
func note(text string) string {
	notes.Lock()
	defer notes.Unlock()
	if notes.f == nil {
		f, err := os.OpenFile("/var/notes", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return "ERR " + err.Error()
		}
		notes.f = f
	}
	if _, err := notes.f.WriteString(text + "\n"); err != nil {
		return "ERR " + err.Error()
	}
	st, err := notes.f.Stat()
	if err != nil {
		return "ERR " + err.Error()
	}
	return strconv.FormatInt(st.Size(), 10)
}

func (c *counter) serveHTTP(conn net.Conn, requestLine string, br *bufio.Reader) {
	req, err := readHTTPRequest(requestLine, br)
	if err != nil {
		return
	}
	if req.isProbe() {
		writeHTTP(conn, 200, "text/plain", "ok")
		return
	}
	if req.method != "GET" {
		writeHTTP(conn, 405, "text/plain", "only GET\n")
		return
	}
	switch req.path {
	case "/inc":
		writeHTTP(conn, 200, "text/plain", strconv.FormatInt(c.inc(), 10)+"\n")
	case "/get":
		writeHTTP(conn, 200, "text/plain", strconv.FormatInt(c.get(), 10)+"\n")
	case "/sum":
		writeHTTP(conn, 200, "text/plain", checksum()+"\n")
	case "/healthz":
		writeHTTP(conn, 200, "text/plain", "ok")
	default:
		writeHTTP(conn, 404, "text/plain", "not found\n")
	}
}

// mapShared maps the first page of path (created, or grown to a page)
// MAP_SHARED: every process mapping it sees the same memory.
func mapShared(path string) []byte {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		fatalf("shared memory %s: %v", path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		fatalf("shared memory %s: %v", path, err)
	} else if st.Size() < pageSize {
		if err := f.Truncate(pageSize); err != nil {
			fatalf("shared memory %s: %v", path, err)
		}
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, pageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fatalf("mmap %s: %v", path, err)
	}
	fmt.Printf("mapped %s shared\n", path)
	return m
}

// sharedInc increments the counter in the shared page; its new value.
func (c *counter) sharedInc() string {
	if c.shared == nil {
		return "ERR no --shared-mem"
	}
	return strconv.FormatUint(atomic.AddUint64((*uint64)(unsafe.Pointer(&c.shared[0])), 1), 10)
}

// fifoEnd is one end of a named pipe; the open (which waits for the other
// end) runs in the background.
type fifoEnd struct {
	mu    sync.Mutex
	f     *os.File
	r     *bufio.Reader
	sent  int
	ready chan struct{}
}

func (e *fifoEnd) open(path string, write bool) {
	if err := syscall.Mkfifo(path, 0o600); err != nil && err != syscall.EEXIST {
		fatalf("mkfifo %s: %v", path, err)
	}
	e.ready = make(chan struct{})
	go func() {
		flag := os.O_RDONLY
		if write {
			flag = os.O_WRONLY
		}
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			fatalf("open fifo %s: %v", path, err)
		}
		e.mu.Lock()
		e.f, e.r = f, bufio.NewReader(f)
		e.mu.Unlock()
		close(e.ready)
		fmt.Printf("fifo %s open\n", path)
	}()
}

// wait: the open end, or an error text.
func (e *fifoEnd) wait() (*os.File, string) {
	if e.ready == nil {
		return nil, "ERR no --fifo-read or --fifo-write"
	}
	select {
	case <-e.ready:
		return e.f, ""
	case <-time.After(5 * time.Second):
		return nil, "ERR the fifo's other end never opened"
	}
}

// send writes line "msg N" (N counting from 1); "sent N".
func (e *fifoEnd) send() string {
	f, bad := e.wait()
	if f == nil {
		return bad
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sent++
	if _, err := fmt.Fprintf(f, "msg %d\n", e.sent); err != nil {
		return "ERR " + err.Error()
	}
	return fmt.Sprintf("sent %d", e.sent)
}

// read: the next line, within 2 s.
func (e *fifoEnd) read() string {
	f, bad := e.wait()
	if f == nil {
		return bad
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = f.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := e.r.ReadString('\n')
	if err != nil {
		return "ERR " + err.Error()
	}
	return strings.TrimRight(line, "\n")
}
